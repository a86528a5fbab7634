//! The witness: what the writers sent and what the server acknowledged, one file per writer in
//! a directory separate from the data, each line fsynced before the writer goes on.
//!
//! Lines:
//! - `SENT seq n kind` before the append: events `seq..seq+n` (see [`Kind`]);
//! - `ACKED seq first last` after the acknowledgement;
//! - `REJECTED seq code pos` for a condition verdict (`pos` is the conflict position, 0 if none);
//! - `FAILED seq message` for any other error answer (the batch is still in doubt);
//! - `SEEN pos seq` for an event served to a subscriber or reader (fsynced in groups).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What kind of append a batch was, enough to regenerate it and judge its condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// No condition.
    Plain,
    /// A boundary guard on the batch's own `uniq:{seq}` tag (must always pass).
    Uniq,
    /// `fail_if_exists(claim:{k})`; the single event carries `claim:{k}`.
    Claim(u64),
    /// A boundary guard on `entity:{e}` with `after`.
    Bound { after: u64, entity: u64 },
    /// A probe append from the checker.
    Probe,
}

impl Kind {
    fn encode(&self) -> String {
        match self {
            Kind::Plain => "plain".into(),
            Kind::Uniq => "uniq".into(),
            Kind::Claim(k) => format!("claim:{k}"),
            Kind::Bound { after, entity } => format!("bound:{after}:{entity}"),
            Kind::Probe => "probe".into(),
        }
    }

    fn decode(s: &str) -> Option<Kind> {
        let mut it = s.split(':');
        Some(match it.next()? {
            "plain" => Kind::Plain,
            "uniq" => Kind::Uniq,
            "probe" => Kind::Probe,
            "claim" => Kind::Claim(it.next()?.parse().ok()?),
            "bound" => Kind::Bound { after: it.next()?.parse().ok()?, entity: it.next()?.parse().ok()? },
            _ => return None,
        })
    }

    /// The claim key carried by the batch's events.
    pub fn claim(&self) -> Option<u64> {
        match self {
            Kind::Claim(k) => Some(*k),
            _ => None,
        }
    }
}

/// One writer's witness file.
pub struct Witness {
    file: File,
    unsynced: usize,
}

impl Witness {
    /// Opens (appending) `dir/name`.
    pub fn open(dir: &Path, name: &str) -> std::io::Result<Witness> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(name))?;
        Ok(Witness { file, unsynced: 0 })
    }

    fn line(&mut self, s: String, sync: bool) {
        self.file.write_all(s.as_bytes()).expect("witness write");
        self.unsynced += 1;
        if sync {
            self.file.sync_data().expect("witness fsync");
            self.unsynced = 0;
        }
    }

    /// Records a batch about to be sent.
    pub fn sent(&mut self, seq: u64, n: u64, kind: &Kind) {
        self.line(format!("SENT {seq} {n} {}\n", kind.encode()), true);
    }

    /// Records an acknowledgement.
    pub fn acked(&mut self, seq: u64, first: u64, last: u64) {
        self.line(format!("ACKED {seq} {first} {last}\n"), true);
    }

    /// Records a condition verdict.
    pub fn rejected(&mut self, seq: u64, code: &str, pos: u64) {
        self.line(format!("REJECTED {seq} {code} {pos}\n"), true);
    }

    /// Records another error answer.
    pub fn failed(&mut self, seq: u64, msg: &str) {
        let msg: String = msg.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
        self.line(format!("FAILED {seq} {msg}\n"), true);
    }

    /// Records an event served to a reader; synced every 64 lines and by [`Witness::sync`].
    pub fn seen(&mut self, pos: u64, seq: u64) {
        let sync = self.unsynced >= 63;
        self.line(format!("SEEN {pos} {seq}\n"), sync);
    }

    /// Syncs pending lines.
    pub fn sync(&mut self) {
        if self.unsynced > 0 {
            self.file.sync_data().expect("witness fsync");
            self.unsynced = 0;
        }
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = self.file.sync_data();
    }
}

/// A sent batch as the witness tells it.
#[derive(Clone, Debug)]
pub struct Batch {
    /// First sequence number.
    pub seq: u64,
    /// Number of events.
    pub n: u64,
    /// Its kind.
    pub kind: Kind,
    /// `(first, last)` when acknowledged.
    pub acked: Option<(u64, u64)>,
    /// `(code, conflict position)` when rejected by its condition.
    pub rejected: Option<(String, u64)>,
    /// The message of any other error answer.
    pub failed: Option<String>,
    /// The witness file it came from.
    pub file: PathBuf,
}

/// Everything in a witness directory.
#[derive(Default, Debug)]
pub struct Record {
    /// Batches by first sequence number.
    pub batches: HashMap<u64, Batch>,
    /// `(pos, seq)` served to readers.
    pub seen: Vec<(u64, u64)>,
    /// Lines that did not parse (a witness file is never torn: the driver is not killed).
    pub bad_lines: Vec<String>,
}

impl Record {
    /// Reads every `*.wit` file in `dir`.
    pub fn load(dir: &Path) -> std::io::Result<Record> {
        let mut r = Record::default();
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "wit")).collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f)?;
            for line in text.lines() {
                if !r.parse(line, &f) {
                    r.bad_lines.push(format!("{}: {line}", f.display()));
                }
            }
        }
        Ok(r)
    }

    fn parse(&mut self, line: &str, file: &Path) -> bool {
        let w: Vec<&str> = line.splitn(4, ' ').collect();
        let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok());
        match w[0] {
            "SENT" => {
                let (Some(seq), Some(n), Some(kind)) = (num(1), num(2), w.get(3).and_then(|s| Kind::decode(s))) else { return false };
                self.batches.insert(seq, Batch { seq, n, kind, acked: None, rejected: None, failed: None, file: file.to_owned() });
                true
            }
            "ACKED" => match (num(1), num(2), num(3)) {
                (Some(seq), Some(a), Some(b)) => self.batches.get_mut(&seq).map(|x| x.acked = Some((a, b))).is_some(),
                _ => false,
            },
            "REJECTED" => {
                let w: Vec<&str> = line.split(' ').collect();
                match (w.get(1).and_then(|s| s.parse::<u64>().ok()), w.get(2), w.get(3).and_then(|s| s.parse::<u64>().ok())) {
                    (Some(seq), Some(code), Some(pos)) => self.batches.get_mut(&seq).map(|x| x.rejected = Some((code.to_string(), pos))).is_some(),
                    _ => false,
                }
            }
            "FAILED" => {
                let w: Vec<&str> = line.splitn(3, ' ').collect();
                match w.get(1).and_then(|s| s.parse::<u64>().ok()) {
                    Some(seq) => self.batches.get_mut(&seq).map(|x| x.failed = Some(w.get(2).unwrap_or(&"").to_string())).is_some(),
                    None => false,
                }
            }
            "SEEN" => match (num(1), num(2)) {
                (Some(p), Some(s)) => {
                    self.seen.push((p, s));
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }
}
