//! The IOMMU behind each device: where its `iommu` link points (Linux adds the link when
//! the device joins an IOMMU, `iommu_device_link()` in drivers/iommu/iommu-sysfs.c). On
//! Arm it names the physical SMMUv3 (`…/arm-smmu-v3.N.auto/iommu/smmu3.0x<base>`): GPUs
//! behind one SMMU share one virtual SMMU in a Grace guest.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use pci_config::Bdf;

/// Each device's IOMMU unit name (the link target's last component), for the devices
/// that have an `iommu` link.
pub fn read_iommu_units(root: &Path, devices: &[Bdf]) -> BTreeMap<Bdf, String> {
    devices
        .iter()
        .filter_map(|bdf| {
            let link = root.join(format!("sys/bus/pci/devices/{bdf}/iommu"));
            let target = fs::read_link(link).ok()?;
            let name = target.file_name()?.to_str()?.to_string();
            Some((*bdf, name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_target_names_the_smmu() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("sys/bus/pci/devices/0009:01:00.0");
        fs::create_dir_all(&dev).unwrap();
        std::os::unix::fs::symlink(
            "../../../../devices/platform/arm-smmu-v3.3.auto/iommu/smmu3.0x0000000016000000",
            dev.join("iommu"),
        )
        .unwrap();
        let a: Bdf = "0009:01:00.0".parse().unwrap();
        let b: Bdf = "0008:01:00.0".parse().unwrap();
        let units = read_iommu_units(dir.path(), &[a, b]);
        assert_eq!(
            units.get(&a).map(String::as_str),
            Some("smmu3.0x0000000016000000")
        );
        assert!(!units.contains_key(&b));
    }
}
