//! `tephra cluster status`: each server of `--servers` asked how it stands in its cluster
//! (docs/journals.md §9.7), one block of text per node, or with `--json` one JSON document per
//! node.
//!
//! How far behind a node is: for each group, the highest commit index any answering node
//! reports for it minus what this node applied (the leader's commit is the highest one known).

use std::collections::BTreeMap;
use std::io::{self, Write};

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use tephra::client::journal::ListOutcome;
use tephra::proto::NodeReport;

use crate::{CliError, Global};

/// `tephra cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// The servers to ask, HOST:PORT,... (instead of --addr).
    #[arg(long, global = true, env = "TEPHRA_SERVERS", value_delimiter = ',', value_name = "HOST:PORT,...")]
    servers: Vec<String>,
    #[command(subcommand)]
    verb: ClusterVerb,
}

/// The cluster verbs.
#[derive(Debug, Subcommand)]
enum ClusterVerb {
    /// Show each node: its zone, its peers' links, and its role, term and lag in each group.
    #[command(override_usage = "tephra cluster status [OPTIONS]")]
    Status,
}

/// What one server said.
struct Seen {
    addr: String,
    report: Result<Option<NodeReport>, String>,
}

/// `tephra cluster status`. Exit 0 when every server answered, 5 when none did, 1 when some
/// did not (each unreachable one is shown with its error).
pub fn run(g: &Global, args: &ClusterArgs) -> Result<(), CliError> {
    let ClusterVerb::Status = args.verb;
    let servers: Vec<String> = if args.servers.is_empty() { vec![g.addr.clone()] } else { args.servers.clone() };
    let mut names = BTreeMap::new();
    let mut seen = Vec::new();
    for addr in &servers {
        let mut j = crate::journal::journals(g, std::slice::from_ref(addr))?;
        let report = j.node_status().map_err(|e| e.to_string());
        if names.is_empty() {
            if let Ok(ListOutcome::Listed(all)) = j.list(None) {
                names = all.into_iter().map(|i| ((i.id.tenant, i.id.journal), format!("{}/{}", i.tenant_name, i.name))).collect();
            }
        }
        seen.push(Seen { addr: addr.trim().to_owned(), report });
    }
    // The highest commit any node reports per group: how far the group has got.
    let mut decided: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for r in seen.iter().filter_map(|s| s.report.as_ref().ok().and_then(Option::as_ref)) {
        for gr in &r.groups {
            let e = decided.entry((gr.tenant, gr.journal)).or_default();
            *e = (*e).max(gr.commit);
        }
    }
    let mut out = io::stdout().lock();
    for s in &seen {
        let text = if g.json { json_of(s, &names, &decided).to_string() } else { text_of(s, &names, &decided) };
        writeln!(out, "{text}").map_err(CliError::output)?;
    }
    out.flush().map_err(CliError::output)?;
    let answered = seen.iter().filter(|s| s.report.is_ok()).count();
    let code = match answered {
        n if n == seen.len() => 0,
        0 => 5,
        _ => 1,
    };
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// A group's name: `directory`, the journal's `TENANT/JOURNAL`, or its ids.
fn group_name(names: &BTreeMap<(u64, u64), String>, tenant: u64, journal: u64) -> String {
    if (tenant, journal) == (0, 0) {
        return "directory".to_owned();
    }
    names.get(&(tenant, journal)).cloned().unwrap_or_else(|| format!("id:{tenant:016x}/{journal:016x}"))
}

fn text_of(s: &Seen, names: &BTreeMap<(u64, u64), String>, decided: &BTreeMap<(u64, u64), u64>) -> String {
    let r = match &s.report {
        Err(e) => return format!("{}: unreachable: {e}", s.addr),
        Ok(None) => return format!("{}: a single node (no [cluster] section)", s.addr),
        Ok(Some(r)) => r,
    };
    let zone = if r.zone.is_empty() { String::new() } else { format!(" zone {}", r.zone) };
    let led = r.groups.iter().filter(|g| g.role == "leader").count();
    let peers: Vec<String> = r
        .peers
        .iter()
        .map(|p| {
            let zone = if p.zone.is_empty() { String::new() } else { format!(" ({})", p.zone) };
            format!("{}{zone} {}", p.node, if p.connected { "up" } else { "DOWN" })
        })
        .collect();
    let mut t = format!("node {} ({}){zone}: leads {led} of {} groups; peers: {}\n", r.node, s.addr, r.groups.len(), peers.join(", "));
    t.push_str(&format!("  {:<40} {:<13} {:>6} {:>6} {:>10} {:>10} {:>7}", "group", "role", "leader", "term", "commit", "applied", "behind"));
    for gr in &r.groups {
        let behind = decided.get(&(gr.tenant, gr.journal)).copied().unwrap_or(gr.commit).saturating_sub(gr.applied);
        let leader = if gr.leader == 0 { "-".to_owned() } else { gr.leader.to_string() };
        t.push_str(&format!(
            "\n  {:<40} {:<13} {:>6} {:>6} {:>10} {:>10} {:>7}",
            group_name(names, gr.tenant, gr.journal),
            gr.role,
            leader,
            gr.term,
            gr.commit,
            gr.applied,
            behind
        ));
    }
    t
}

fn json_of(s: &Seen, names: &BTreeMap<(u64, u64), String>, decided: &BTreeMap<(u64, u64), u64>) -> Value {
    let r = match &s.report {
        Err(e) => return json!({"addr": s.addr, "error": e}),
        Ok(None) => return json!({"addr": s.addr, "node": null}),
        Ok(Some(r)) => r,
    };
    let groups: Vec<Value> = r
        .groups
        .iter()
        .map(|gr| {
            json!({
                "group": group_name(names, gr.tenant, gr.journal),
                "tenant": format!("{:016x}", gr.tenant),
                "journal": format!("{:016x}", gr.journal),
                "role": gr.role,
                "leader": (gr.leader != 0).then_some(gr.leader),
                "term": gr.term,
                "commit": gr.commit,
                "applied": gr.applied,
                "behind": decided.get(&(gr.tenant, gr.journal)).copied().unwrap_or(gr.commit).saturating_sub(gr.applied),
                "voters": gr.voters,
            })
        })
        .collect();
    let peers: Vec<Value> =
        r.peers.iter().map(|p| json!({"node": p.node, "addr": p.addr, "connected": p.connected, "zone": (!p.zone.is_empty()).then_some(&p.zone)})).collect();
    json!({
        "addr": s.addr,
        "node": r.node,
        "zone": (!r.zone.is_empty()).then_some(&r.zone),
        "leader_changes": r.leader_changes,
        "peers": peers,
        "groups": groups,
    })
}
