//! The VirtualMachineInstance JSON that KubeVirt's sidecar shim hands an `onDefineDomain`
//! hook (`--vmi JSON`): the VMI's name and the domain aliases of its PCI devices.
//!
//! KubeVirt (pkg/virt-launcher/virtwrap/device/hostdevice) names the `<hostdev>` of each
//! `spec.domain.devices.gpus[]` entry `ua-gpu-<name>` and of each `hostDevices[]` entry
//! `ua-hostdevice-<name>` (`ua-` marks a user-defined alias), with `managed='no'`.

use serde::Deserialize;

/// The hook's argument is held in memory whole; a VMI is far below this.
pub const MAX_VMI_BYTES: usize = 4 << 20;

/// What the hook needs from the VMI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubevirtVmi {
    /// `namespace/name`, for messages.
    pub name: String,
    /// Domain alias → the device-plugin resource it came from (`nvidia.com/GH100_H200`).
    pub device_aliases: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct Vmi {
    #[serde(default)]
    metadata: Metadata,
    spec: Spec,
}

#[derive(Deserialize, Default)]
struct Metadata {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Deserialize)]
struct Spec {
    domain: Domain,
}

#[derive(Deserialize)]
struct Domain {
    #[serde(default)]
    devices: Devices,
}

#[derive(Deserialize, Default)]
struct Devices {
    #[serde(default)]
    gpus: Vec<Device>,
    #[serde(default, rename = "hostDevices")]
    host_devices: Vec<Device>,
}

#[derive(Deserialize)]
struct Device {
    name: String,
    #[serde(default, rename = "deviceName")]
    device_name: String,
}

/// Parses the `--vmi` text.
pub fn parse_kubevirt_vmi(text: &str) -> Result<KubevirtVmi, String> {
    if text.len() > MAX_VMI_BYTES {
        return Err(format!(
            "--vmi is {} bytes, more than the {MAX_VMI_BYTES} a VMI can be",
            text.len()
        ));
    }
    let vmi: Vmi = serde_json::from_str(text).map_err(|e| {
        format!("--vmi is not a VirtualMachineInstance (spec.domain is needed): {e}")
    })?;
    let name = match (vmi.metadata.namespace.as_str(), vmi.metadata.name.as_str()) {
        ("", "") => "the VMI".to_string(),
        ("", n) => n.to_string(),
        (ns, n) => format!("{ns}/{n}"),
    };
    let d = vmi.spec.domain.devices;
    let device_aliases = d
        .gpus
        .into_iter()
        .map(|g| (format!("ua-gpu-{}", g.name), g.device_name))
        .chain(
            d.host_devices
                .into_iter()
                .map(|h| (format!("ua-hostdevice-{}", h.name), h.device_name)),
        )
        .collect();
    Ok(KubevirtVmi {
        name,
        device_aliases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_as_kubevirt_names_them() {
        let v = parse_kubevirt_vmi(
            r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
                "metadata":{"name":"train0","namespace":"ml"},
                "spec":{"domain":{"devices":{
                    "gpus":[{"name":"gpu1","deviceName":"nvidia.com/GH100_H200"}],
                    "hostDevices":[{"name":"nic","deviceName":"mellanox.com/cx7"}]}}}}"#,
        )
        .unwrap();
        assert_eq!(v.name, "ml/train0");
        assert_eq!(
            v.device_aliases,
            [
                (
                    "ua-gpu-gpu1".to_string(),
                    "nvidia.com/GH100_H200".to_string()
                ),
                ("ua-hostdevice-nic".into(), "mellanox.com/cx7".into())
            ]
        );
        assert!(parse_kubevirt_vmi(r#"{"metadata":{}}"#)
            .unwrap_err()
            .starts_with("--vmi is not a VirtualMachineInstance"));
    }
}
