//! Facts about the machine and the storage under a directory: kernel, filesystem
//! (statfs magic plus the matching `/proc/self/mountinfo` entry), the backing block
//! device's sysfs flags (`queue/write_cache`, `queue/rotational`, driver, model) and
//! the CPU count. Printed next to every fsync result, because a number without the
//! storage it was measured on means nothing.

use serde::Serialize;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `statfs(2)` magic numbers of the filesystems we name (from `linux/magic.h`).
const FS_MAGICS: &[(u64, &str)] = &[
    (0xEF53, "ext2/ext3/ext4"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58f6, "ramfs"),
    (0x794c_7630, "overlayfs"),
    (0x2fc1_2fc1, "zfs"),
    (0xF2F5_2010, "f2fs"),
    (0x6969, "nfs"),
    (0xFF53_4D42, "cifs"),
    (0x6573_5546, "fuse"),
    (0x0102_1997, "9p"),
    (0x4d44, "vfat"),
    (0x5346_544e, "ntfs"),
    (0x7371_7368, "squashfs"),
    (0x2405_1905, "ubifs"),
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
];

/// Filesystem magic of tmpfs (`TMPFS_MAGIC`).
pub const TMPFS_MAGIC: u64 = 0x0102_1994;
/// Filesystem magic of ramfs (`RAMFS_MAGIC`).
pub const RAMFS_MAGIC: u64 = 0x8584_58f6;

/// Returns the name we give a `statfs` `f_type` magic number, if we know it.
pub fn fs_name_from_magic(magic: u64) -> Option<&'static str> {
    FS_MAGICS.iter().find(|(m, _)| *m == magic).map(|(_, n)| *n)
}

/// The filesystem a directory lives on.
#[derive(Debug, Clone, Serialize)]
pub struct FsInfo {
    /// `statfs` `f_type`, as a hex string (e.g. `"0xef53"`).
    pub magic: String,
    /// Name derived from the magic number (`"ext2/ext3/ext4"`, `"tmpfs"`, ... or `"unknown"`).
    pub magic_name: String,
    /// Filesystem type as the kernel's mount table names it (e.g. `"ext4"`), when found.
    pub mount_fstype: Option<String>,
    /// Mount point that contains the directory, when found.
    pub mount_point: Option<String>,
    /// Mount source (e.g. `"/dev/vda"`), when found.
    pub mount_source: Option<String>,
    /// Mount options, when found.
    pub mount_options: Option<String>,
    /// True for tmpfs/ramfs, where fsync does not reach any stable medium.
    pub in_memory: bool,
    /// Free bytes available to unprivileged users (`statvfs` `f_bavail * f_frsize`).
    pub free_bytes: u64,
}

/// The block device behind a filesystem, as sysfs describes it.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    /// Kernel name of the whole-disk device (e.g. `"vda"`, `"nvme0n1"`).
    pub name: String,
    /// `major:minor` of the device the filesystem reported (may be a partition).
    pub dev: String,
    /// `/sys/block/<name>/queue/write_cache`: `"write back"` (volatile cache, the kernel
    /// sends flushes) or `"write through"` (the kernel sends no flushes).
    pub write_cache: Option<String>,
    /// `/sys/block/<name>/queue/rotational`: true for spinning disks.
    pub rotational: Option<bool>,
    /// `/sys/block/<name>/queue/logical_block_size`.
    pub logical_block_size: Option<u64>,
    /// `/sys/block/<name>/device/model`, trimmed.
    pub model: Option<String>,
    /// Name of the driver bound to `/sys/block/<name>/device` (e.g. `"virtio_blk"`).
    pub driver: Option<String>,
    /// True when the driver or model names a hypervisor's virtual disk.
    pub virtual_disk: bool,
    /// True when the device is RAM-backed (`zram*`, `ram*`, `pmem*` is not counted).
    pub ram_backed: bool,
    /// True for loop devices, whose durability depends on their backing file.
    pub loop_device: bool,
}

/// Everything we report about the machine next to the numbers.
#[derive(Debug, Clone, Serialize)]
pub struct MachineFacts {
    /// `uname`: sysname, release, version and machine, space separated.
    pub kernel: String,
    /// Online CPUs (`sysconf(_SC_NPROCESSORS_ONLN)`).
    pub cpus_online: usize,
    /// CPUs this process may run on (`available_parallelism`).
    pub cpus_available: usize,
    /// The directory probed, canonicalized.
    pub dir: String,
    /// Filesystem of the directory.
    pub fs: FsInfo,
    /// Backing block device, when discoverable (not for tmpfs, network filesystems, ...).
    pub device: Option<DeviceInfo>,
}

/// Returns `uname -srvm` as one string.
pub fn kernel_string() -> String {
    // SAFETY: `uname` fills a zeroed, properly sized struct; the fields are NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown".into();
        }
        let f = |s: &[libc::c_char]| std::ffi::CStr::from_ptr(s.as_ptr()).to_string_lossy().into_owned();
        format!("{} {} {} {}", f(&u.sysname), f(&u.release), f(&u.version), f(&u.machine))
    }
}

/// Online CPU count.
pub fn cpus_online() -> usize {
    // SAFETY: plain sysconf query.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// One parsed line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount point, with octal escapes decoded.
    pub mount_point: String,
    /// Filesystem type.
    pub fstype: String,
    /// Mount source.
    pub source: String,
    /// Per-mount options, then `; super: ` and the superblock options.
    pub options: String,
}

fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/self/mountinfo` text into entries (lines that do not parse are skipped).
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if l.len() < 6 || r.len() < 2 {
                return None;
            }
            Some(MountEntry {
                mount_point: unescape_octal(l[4]),
                fstype: r[0].to_string(),
                source: unescape_octal(r[1]),
                options: format!("{}{}", l[5], r.get(2).map(|s| format!("; super: {s}")).unwrap_or_default()),
            })
        })
        .collect()
}

/// Picks the mount that contains `path` (longest matching mount point; the last one
/// wins among equal mount points, as the kernel stacks them).
pub fn find_mount<'a>(mounts: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let mut best: Option<&MountEntry> = None;
    for m in mounts {
        if path.starts_with(Path::new(&m.mount_point)) && best.is_none_or(|b| m.mount_point.len() >= b.mount_point.len()) {
            best = Some(m);
        }
    }
    best
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Describes the whole-disk block device `major:minor` from sysfs, if it exists.
pub fn device_info(major: u64, minor: u64) -> Option<DeviceInfo> {
    let link = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let mut dir = fs::canonicalize(&link).ok()?;
    if dir.join("partition").exists() {
        dir = dir.parent()?.to_path_buf();
    }
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let q = dir.join("queue");
    let driver = fs::read_link(dir.join("device/driver")).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let model = read_trim(&dir.join("device/model"));
    let virtual_disk = driver.as_deref().is_some_and(|d| ["virtio", "xen", "vbd", "hv_storvsc", "vmw_pvscsi"].iter().any(|k| d.contains(k)))
        || model.as_deref().is_some_and(|m| ["QEMU", "VBOX", "Virtual", "VMware", "Elastic Block", "PersistentDisk"].iter().any(|k| m.contains(k)));
    Some(DeviceInfo {
        dev: format!("{major}:{minor}"),
        write_cache: read_trim(&q.join("write_cache")),
        rotational: read_trim(&q.join("rotational")).map(|s| s == "1"),
        logical_block_size: read_trim(&q.join("logical_block_size")).and_then(|s| s.parse().ok()),
        model,
        driver,
        virtual_disk,
        ram_backed: name.starts_with("zram") || (name.starts_with("ram") && name[3..].chars().all(|c| c.is_ascii_digit())),
        loop_device: name.starts_with("loop"),
        name,
    })
}

/// Other load on the machine at one moment: the probe shares the disk and CPUs with
/// whatever else runs, and says so.
#[derive(Debug, Clone, Serialize)]
pub struct Contention {
    /// `/proc/loadavg` 1-minute load average.
    pub loadavg_1m: Option<f64>,
    /// `/proc/pressure/io` "some avg10": % of the last 10 s in which some task waited on I/O.
    pub io_pressure_some_avg10: Option<f64>,
}

/// Samples [`Contention`] now.
pub fn contention() -> Contention {
    let loadavg_1m = fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()));
    let io_pressure_some_avg10 = fs::read_to_string("/proc/pressure/io").ok().and_then(|s| parse_psi_some_avg10(&s));
    Contention { loadavg_1m, io_pressure_some_avg10 }
}

/// Extracts `avg10` from the `some` line of a `/proc/pressure/*` file.
pub fn parse_psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace().find_map(|kv| kv.strip_prefix("avg10=")).and_then(|v| v.parse().ok())
}

/// Gathers the facts for `dir` (which must exist).
pub fn gather(dir: &Path) -> std::io::Result<MachineFacts> {
    let canon = fs::canonicalize(dir)?;
    let st = nix::sys::statfs::statfs(&canon).map_err(std::io::Error::from)?;
    let magic = st.filesystem_type().0 as u64;
    let vfs = nix::sys::statvfs::statvfs(&canon).map_err(std::io::Error::from)?;
    let free_bytes = (vfs.blocks_available() as u64).saturating_mul(vfs.fragment_size() as u64);

    let mounts = fs::read_to_string("/proc/self/mountinfo").map(|t| parse_mountinfo(&t)).unwrap_or_default();
    let mount = find_mount(&mounts, &canon).cloned();

    let meta = fs::metadata(&canon)?;
    let dev = meta.dev();
    let (mut major, mut minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
    if major == 0 {
        // Anonymous device (btrfs subvolumes, overlayfs, tmpfs): fall back to the mount source.
        if let Some(src) = mount.as_ref().map(|m| m.source.clone()).filter(|s| s.starts_with("/dev/")) {
            if let Ok(m) = fs::metadata(&src) {
                major = libc::major(m.rdev()) as u64;
                minor = libc::minor(m.rdev()) as u64;
            }
        }
    }
    let device = if major != 0 { device_info(major, minor) } else { None };

    Ok(MachineFacts {
        kernel: kernel_string(),
        cpus_online: cpus_online(),
        cpus_available: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        dir: canon.display().to_string(),
        fs: FsInfo {
            magic: format!("{magic:#x}"),
            magic_name: fs_name_from_magic(magic).unwrap_or("unknown").to_string(),
            mount_fstype: mount.as_ref().map(|m| m.fstype.clone()),
            mount_point: mount.as_ref().map(|m| m.mount_point.clone()),
            mount_source: mount.as_ref().map(|m| m.source.clone()),
            mount_options: mount.as_ref().map(|m| m.options.clone()),
            in_memory: magic == TMPFS_MAGIC || magic == RAMFS_MAGIC,
            free_bytes,
        },
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_parsing() {
        let t = "some avg10=13.45 avg60=6.27 avg300=2.18 total=1\nfull avg10=0.12 avg60=0 avg300=0 total=2\n";
        assert_eq!(parse_psi_some_avg10(t), Some(13.45));
        assert_eq!(parse_psi_some_avg10("garbage"), None);
    }

    #[test]
    fn magic_names() {
        assert_eq!(fs_name_from_magic(0xEF53), Some("ext2/ext3/ext4"));
        assert_eq!(fs_name_from_magic(TMPFS_MAGIC), Some("tmpfs"));
        assert_eq!(fs_name_from_magic(1), None);
    }

    #[test]
    fn mountinfo_parsing_and_longest_prefix() {
        let text = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
30 22 0:25 / /tmp\\040dir rw,nosuid - tmpfs tmpfs rw,size=10g
31 22 0:26 / /work/sub rw - xfs /dev/vdb1 rw
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].mount_point, "/tmp dir");
        assert_eq!(find_mount(&m, Path::new("/tmp dir/x")).unwrap().fstype, "tmpfs");
        assert_eq!(find_mount(&m, Path::new("/work/sub/a")).unwrap().fstype, "xfs");
        assert_eq!(find_mount(&m, Path::new("/work/subway")).unwrap().fstype, "ext4");
        assert_eq!(m[0].options, "rw,relatime; super: rw,discard");
    }
}
