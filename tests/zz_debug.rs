use support::Cluster;
use tephra_test_support as support;
#[test]
fn debug() {
    let mut cluster = Cluster::start(std::path::Path::new(env!("CARGO_BIN_EXE_tephra-server")), 3, &[("RUST_LOG", "info,raft=debug")]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    cluster.kill(3);
    std::fs::remove_dir_all(cluster.data_dir(3)).unwrap();
    cluster.start_node(3);
    std::thread::sleep(std::time::Duration::from_millis(3000));
    for id in 1..=3 {
        if let Some(n) = cluster.node(id) {
            eprintln!("--- node {id}\n{}", n.log());
        }
    }
}
