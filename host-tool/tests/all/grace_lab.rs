//! The aarch64 Grace lab stage (tests/lab/grace/run; fixture tests/fixtures/grace/lab, kept by
//! its `record` script): QEMU 11.1 booted, under TCG, today's `gen qemu` for a Grace example
//! with stand-ins in the GPUs' places. Its guest side (the agent's judgement of the nodes)
//! is replayed by guest-agent/tests/grace_lab.rs; here: the arguments it booted are gen's.

use crate::recording;
use serde_json::Value;

fn fixture(name: &str) -> String {
    recording::fixture("grace/lab", name)
}

fn json(name: &str) -> Value {
    serde_json::from_str(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn args(name: &str) -> Vec<String> {
    serde_json::from_value(json(name)).unwrap()
}

#[test]
fn todays_gen_is_the_one_the_grace_guest_booted() {
    let example = fixture("example.txt").trim().to_string();
    assert_ne!(
        example, "hand",
        "the fixture is the hand-written guest: record a run of gen's"
    );
    let dir = tempfile::tempdir().unwrap();
    let expect = dir.path().join("expect.json");
    let out = crate::cli::vfio_p2p()
        .args([
            "--example",
            &example,
            "gen",
            "qemu",
            "--format",
            "json",
            "--expect-out",
        ])
        .arg(&expect)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the expectation's file is wherever --expect-out put it, here and in the lab
    let at = |v: Value| -> Vec<String> {
        serde_json::from_value::<Vec<String>>(v)
            .unwrap()
            .into_iter()
            .map(|a| match a.split_once(",file=") {
                Some((name, _)) if name == "name=opt/vfio-p2p/expect.json" => {
                    format!("{name},file=…")
                }
                _ => a,
            })
            .collect()
    };
    let today: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        at(today),
        at(json("gen.json")),
        "gen qemu changed since the guest booted: run the stage and record again"
    );
    let today: Value = serde_json::from_str(&std::fs::read_to_string(&expect).unwrap()).unwrap();
    assert_eq!(today, json("expect.json"));
}

/// `{"driver":…}` or `driver,k=v,…` → the driver and its properties.
fn device(arg: &str) -> (String, serde_json::Map<String, Value>) {
    if arg.starts_with('{') {
        let mut v: serde_json::Map<String, Value> = serde_json::from_str(arg).unwrap();
        let d = v.remove("driver").unwrap().as_str().unwrap().to_string();
        return (d, v);
    }
    let mut parts = arg.split(',');
    let d = parts.next().unwrap().to_string();
    let props = parts
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    (d, props)
}

fn devices(argv: &[String]) -> Vec<(String, serde_json::Map<String, Value>)> {
    argv.windows(2)
        .filter(|w| w[0] == "-device")
        .map(|w| device(&w[1]))
        .collect()
}

#[test]
fn the_guest_ran_gens_topology_with_stand_ins_for_the_gpus() {
    let gen = args("gen.json");
    let run = args("argv-run.json");
    // NUMA nodes, distances and generic initiators exactly as gen wrote them
    for w in gen
        .windows(2)
        .filter(|w| w[0] == "-numa" || w[1].starts_with("acpi-generic-initiator,"))
    {
        assert!(run.windows(2).any(|r| r == w), "{w:?} is not in the run");
    }
    assert!(gen.iter().any(|a| a.starts_with("acpi-generic-initiator,")));
    let ran = devices(&run);
    for (driver, props) in devices(&gen) {
        let same = |d: &str, keep: &[&str]| {
            ran.iter()
                .any(|(rd, rp)| rd == d && keep.iter().all(|k| rp.get(*k) == props.get(*k)))
        };
        match driver.as_str() {
            // the GPU: a stand-in with its id (the generic initiators' pci-dev), bus and address
            "vfio-pci" => assert!(same("bochs-display", &["id", "bus", "addr"]), "{props:?}"),
            // the vSMMU on its pxb: all but accel (nesting on a host SMMU)
            "arm-smmuv3" => assert!(same("arm-smmuv3", &["id", "primary-bus"]), "{props:?}"),
            d => {
                let keys: Vec<&str> = props.keys().map(String::as_str).collect();
                assert!(
                    same(d, &keys),
                    "{d} {props:?} is not in the run as gen wrote it"
                );
            }
        }
    }
    assert!(ran.iter().any(|(d, _)| d == "pxb-pcie"));
    assert!(ran.iter().any(|(d, _)| d == "arm-smmuv3"));
}
