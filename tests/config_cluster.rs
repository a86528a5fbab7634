//! The `[cluster]` section: absent by default, set from the file and from `TEPHRA__CLUSTER__*`
//! (the peer list as one comma-separated variable), every refusal naming what is wrong, the
//! parsed members and the cluster id; `cluster.tls_ca` required with `[tls]` and refused
//! without it.

use std::collections::BTreeMap;
use std::path::Path;

use tephra::config::*;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn resolve(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    resolve_sources(None, env(vars), &Overrides::default())
}

fn from_file(text: &str) -> Result<Settings, ConfigError> {
    resolve_sources(Some(FileSource { path: Path::new("/etc/tephra.toml"), text }), std::iter::empty(), &Overrides::default())
}

fn invalid(result: Result<Settings, ConfigError>) -> String {
    match result {
        Err(ConfigError::Invalid { message }) => message,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

const FILE: &str = r#"
[cluster]
node_id = 2
bind = "127.0.0.1:9402"
peers = ["1=127.0.0.1:9401", "2=127.0.0.1:9402", "3=node-c.local:9403"]
zone = "rack-b"
tick_ms = 25
"#;

#[test]
fn absent_means_a_single_node() {
    assert_eq!(resolve(&[]).unwrap().cluster, None);
    assert_eq!(Settings::default().cluster, None);
}

#[test]
fn the_file_sets_every_key_and_members_leave_this_node_out() {
    let c = from_file(FILE).unwrap().cluster.unwrap();
    assert_eq!((c.node_id, c.bind.as_str(), c.zone.as_deref(), c.tick_ms), (2, "127.0.0.1:9402", Some("rack-b"), 25));
    assert_eq!(c.tick(), std::time::Duration::from_millis(25));
    let members = c.members().unwrap();
    assert_eq!(members, BTreeMap::from([(1, "127.0.0.1:9401".to_owned()), (3, "node-c.local:9403".to_owned())]));
}

#[test]
fn defaults_of_the_optional_keys() {
    let c = from_file("[cluster]\nnode_id = 1\nbind = \"127.0.0.1:9401\"\n").unwrap().cluster.unwrap();
    assert_eq!((c.tick_ms, c.zone.as_deref(), c.peers.len()), (DEFAULT_TICK_MS, None, 0));
    assert!(c.members().unwrap().is_empty());
}

#[test]
fn the_environment_sets_every_key_with_the_peers_as_one_comma_list() {
    let s = resolve(&[
        ("TEPHRA__CLUSTER__NODE_ID", "3"),
        ("TEPHRA__CLUSTER__BIND", "0.0.0.0:9403"),
        ("TEPHRA__CLUSTER__PEERS", "1=10.0.0.1:9401, 2=10.0.0.2:9402,3=10.0.0.3:9403,"),
        ("TEPHRA__CLUSTER__ZONE", "east"),
        ("TEPHRA__CLUSTER__TICK_MS", "5"),
    ])
    .unwrap();
    let c = s.cluster.unwrap();
    assert_eq!((c.node_id, c.bind.as_str(), c.zone.as_deref(), c.tick_ms), (3, "0.0.0.0:9403", Some("east"), 5));
    assert_eq!(c.peers, ["1=10.0.0.1:9401", "2=10.0.0.2:9402", "3=10.0.0.3:9403"]);
    assert_eq!(c.members().unwrap().into_keys().collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn the_environment_overrides_the_file_per_key() {
    let file = FileSource { path: Path::new("/etc/tephra.toml"), text: FILE };
    let s =
        resolve_sources(Some(file), env(&[("TEPHRA__CLUSTER__PEERS", "1=127.0.0.1:9401"), ("TEPHRA__CLUSTER__TICK_MS", "7")]), &Overrides::default()).unwrap();
    let c = s.cluster.unwrap();
    assert_eq!((c.node_id, c.tick_ms, c.zone.as_deref()), (2, 7, Some("rack-b")));
    assert_eq!(c.members().unwrap().into_keys().collect::<Vec<_>>(), [1]);
    // A single string in the file is a comma list too.
    let c = from_file("[cluster]\nnode_id = 1\nbind = \"127.0.0.1:9401\"\npeers = \"2=127.0.0.1:9402,3=127.0.0.1:9403\"\n").unwrap().cluster.unwrap();
    assert_eq!(c.members().unwrap().len(), 2);
}

#[test]
fn node_id_and_bind_are_required() {
    assert!(invalid(resolve(&[("TEPHRA__CLUSTER__BIND", "127.0.0.1:9401")])).starts_with("cluster.node_id must be set"));
    assert!(invalid(resolve(&[("TEPHRA__CLUSTER__NODE_ID", "0"), ("TEPHRA__CLUSTER__BIND", "127.0.0.1:9401")])).starts_with("cluster.node_id must be set"));
    let e = invalid(resolve(&[("TEPHRA__CLUSTER__NODE_ID", "1")]));
    assert!(e.starts_with("cluster.bind must be an address"), "{e}");
    let e = invalid(resolve(&[("TEPHRA__CLUSTER__NODE_ID", "1"), ("TEPHRA__CLUSTER__BIND", "nine thousand")]));
    assert!(e.starts_with("cluster.bind must be an address") && e.contains("nine thousand"), "{e}");
    let e = invalid(resolve(&[("TEPHRA__BIND", "127.0.0.1:9000"), ("TEPHRA__CLUSTER__NODE_ID", "1"), ("TEPHRA__CLUSTER__BIND", "127.0.0.1:9000")]));
    assert!(e.starts_with("cluster.bind must differ from bind"), "{e}");
}

#[test]
fn malformed_and_repeated_peers_are_refused_naming_the_entry() {
    let base = [("TEPHRA__CLUSTER__NODE_ID", "1"), ("TEPHRA__CLUSTER__BIND", "127.0.0.1:9401")];
    for (peers, names) in [
        ("2=127.0.0.1:9402,127.0.0.1:9403", "\"127.0.0.1:9403\""),
        ("two=127.0.0.1:9402", "\"two=127.0.0.1:9402\""),
        ("0=127.0.0.1:9402", "\"0=127.0.0.1:9402\""),
        ("2=", "\"2=\""),
        ("2=127.0.0.1", "\"2=127.0.0.1\""),
        ("-2=127.0.0.1:9402", "\"-2=127.0.0.1:9402\""),
    ] {
        let e = invalid(resolve(&[base[0], base[1], ("TEPHRA__CLUSTER__PEERS", peers)]));
        assert!(e.starts_with("cluster.peers entry ") && e.contains(names) && e.contains("ID=HOST:PORT"), "{peers}: {e}");
    }
    for peers in ["2=127.0.0.1:9402,2=127.0.0.1:9412", "1=127.0.0.1:9401,1=127.0.0.1:9401"] {
        let e = invalid(resolve(&[base[0], base[1], ("TEPHRA__CLUSTER__PEERS", peers)]));
        assert!(e.contains("a second time"), "{peers}: {e}");
    }
    // Two nodes at one peer address: one would never be reached.
    let e = invalid(resolve(&[base[0], base[1], ("TEPHRA__CLUSTER__PEERS", "2=127.0.0.1:9402,3=127.0.0.1:9402")]));
    assert!(e.contains("\"3=127.0.0.1:9402\"") && e.contains("gives node 3 the address of node 2"), "{e}");
}

#[test]
fn zone_length_and_tick_bounds() {
    let base = [("TEPHRA__CLUSTER__NODE_ID", "1"), ("TEPHRA__CLUSTER__BIND", "127.0.0.1:9401")];
    let zone = "z".repeat(MAX_ZONE_LEN);
    assert!(resolve(&[base[0], base[1], ("TEPHRA__CLUSTER__ZONE", &zone)]).is_ok());
    let long = "z".repeat(MAX_ZONE_LEN + 1);
    assert_eq!(invalid(resolve(&[base[0], base[1], ("TEPHRA__CLUSTER__ZONE", &long)])), "cluster.zone must be at most 64 bytes, got 65");
    for ok in ["1", "1000"] {
        assert!(resolve(&[base[0], base[1], ("TEPHRA__CLUSTER__TICK_MS", ok)]).is_ok(), "{ok}");
    }
    for bad in ["0", "1001"] {
        assert_eq!(invalid(resolve(&[base[0], base[1], ("TEPHRA__CLUSTER__TICK_MS", bad)])), format!("cluster.tick_ms must be between 1 and 1000, got {bad}"));
    }
}

#[test]
fn tls_ca_goes_with_tls_and_only_with_it() {
    let base = [("TEPHRA__CLUSTER__NODE_ID", "1"), ("TEPHRA__CLUSTER__BIND", "127.0.0.1:9401")];
    let tls = [("TEPHRA__TLS__CERT", "/etc/tephra/node-1.pem"), ("TEPHRA__TLS__KEY", "/etc/tephra/node-1.key")];
    let ca = ("TEPHRA__CLUSTER__TLS_CA", "/etc/tephra/ca.pem");
    // Both: peer links use TLS, trusting that CA.
    let c = resolve(&[base[0], base[1], tls[0], tls[1], ca]).unwrap().cluster.unwrap();
    assert_eq!(c.tls_ca.as_deref(), Some(Path::new("/etc/tephra/ca.pem")));
    let file = "[tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n[cluster]\nnode_id = 1\nbind = \"127.0.0.1:9401\"\ntls_ca = \"/ca.pem\"\n";
    assert_eq!(from_file(file).unwrap().cluster.unwrap().tls_ca.as_deref(), Some(Path::new("/ca.pem")));
    // Neither: plain TCP, as before.
    assert_eq!(resolve(&base).unwrap().cluster.unwrap().tls_ca, None);
    // [tls] alone, cluster.tls_ca alone, an empty path: refused, saying what to set.
    assert_eq!(
        invalid(resolve(&[base[0], base[1], tls[0], tls[1]])),
        "cluster peer links use TLS when [tls] is set: set cluster.tls_ca to the CA that signed every node's certificate"
    );
    let e = invalid(resolve(&[base[0], base[1], ca]));
    assert!(e.starts_with("cluster.tls_ca is set but [tls] is not") && e.contains("set tls.cert and tls.key"), "{e}");
    assert_eq!(invalid(resolve(&[base[0], base[1], tls[0], tls[1], ("TEPHRA__CLUSTER__TLS_CA", "")])), "cluster.tls_ca must not be empty");
    // A single node with [tls] needs no CA.
    assert!(resolve(&tls).is_ok());
}

#[test]
fn unknown_keys_and_wrong_types_are_schema_errors() {
    let e = from_file("[cluster]\nnode_id = 1\nbind = \"127.0.0.1:9401\"\nmembers = []\n").unwrap_err();
    assert!(matches!(e, ConfigError::Schema { .. }) && e.to_string().contains("unknown field `members`"), "{e}");
    let e = resolve(&[("TEPHRA__CLUSTER__NODE_ID", "one")]).unwrap_err();
    assert!(matches!(e, ConfigError::Schema { .. }) && e.to_string().contains("TEPHRA__CLUSTER__NODE_ID"), "{e}");
}

#[test]
fn the_cluster_id_depends_on_the_set_of_nodes_only() {
    let id = cluster_id([1, 2, 3]);
    assert_eq!(id, cluster_id([3, 1, 2]));
    assert_eq!(id, cluster_id([2, 3, 1, 2]));
    assert_ne!(id, cluster_id([1, 2]));
    assert_ne!(id, cluster_id([1, 2, 4]));
    // Stable across builds and runs: FNV-1a over the sorted ids' little-endian bytes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in [1u64, 2, 3].iter().flat_map(|i| i.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    assert_eq!(id, h);
    // Every node of one configuration agrees, whatever addresses it lists.
    let on = |me: u64, peers: &str| {
        let c = resolve(&[("TEPHRA__CLUSTER__NODE_ID", &me.to_string()), ("TEPHRA__CLUSTER__BIND", "127.0.0.1:9400"), ("TEPHRA__CLUSTER__PEERS", peers)])
            .unwrap()
            .cluster
            .unwrap();
        cluster_id(c.members().unwrap().into_keys().chain([me]))
    };
    assert_eq!(on(1, "2=10.0.0.2:1,3=10.0.0.3:1"), on(3, "1=127.0.0.1:7001,2=127.0.0.1:7002,3=x:1"));
}
