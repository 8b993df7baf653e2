//! NUMA node ids as people and libvirt write them: ranges where they run on (`2-9`,
//! `1,3-4`).

/// Node ids as a list with ranges (`2-9`, `3,5`), `N/A` when there are none.
pub fn node_list(nodes: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        let mut j = i;
        while j + 1 < nodes.len() && nodes[j + 1] == nodes[j] + 1 {
            j += 1;
        }
        parts.push(match j > i {
            true => format!("{}-{}", nodes[i], nodes[j]),
            false => nodes[i].to_string(),
        });
        i = j + 1;
    }
    if parts.is_empty() {
        "N/A".into()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranges() {
        assert_eq!(super::node_list(&[2, 3, 4, 5]), "2-5");
        assert_eq!(super::node_list(&[1, 3, 4]), "1,3-4");
        assert_eq!(super::node_list(&[7]), "7");
        assert_eq!(super::node_list(&[]), "N/A");
    }
}
