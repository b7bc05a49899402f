//! Appending group commits to an open segment file in a local directory.

use super::*;

/// How far a local journal write goes before the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `fdatasync` every group commit: survives power loss.
    #[default]
    Fsync,
    /// Leave the bytes in the OS page cache: survives a crash of the process, not of the
    /// machine. Faster; for tests and benchmarks.
    ProcessCrash,
}

const ROLL_BYTES: u64 = 64 << 20;

/// Appends group commits to an open segment file in a local directory.
#[derive(Debug)]
pub(super) struct Appender {
    pub(super) wal_dir: PathBuf,
    pub(super) durability: Durability,
    /// The open segment: first lsn, file, bytes written.
    pub(super) active: Option<(Lsn, std::fs::File, u64)>,
    pub(super) roll: bool,
    /// The broker closed: no byte may reach the directory after its lock is released.
    pub(super) closed: bool,
    pub(super) faults: Faults,
}

/// Makes a file's creation, rename or removal in `dir` durable.
pub(super) fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl Appender {
    /// Appends `bytes` (entries `first..`) and returns the first lsn of the segment that
    /// holds them, the byte they start at in it, and whether that segment is new.
    pub(super) fn append(&mut self, first: Lsn, bytes: &[u8]) -> std::io::Result<(Lsn, u64, bool)> {
        use std::io::Write;
        if self.closed {
            return Err(std::io::Error::other("the broker is closed"));
        }
        let full = self.active.as_ref().is_some_and(|(_, _, size)| *size >= ROLL_BYTES);
        let mut created = false;
        if self.active.is_none() || full || self.roll {
            if !self.wal_dir.exists() {
                std::fs::create_dir_all(&self.wal_dir)?;
                if let (Durability::Fsync, Some(parent)) = (self.durability, self.wal_dir.parent()) {
                    sync_dir(parent)?;
                }
            }
            let path = self.wal_dir.join(format!("{first:020}.seg"));
            // A kill between creating a segment and writing to it leaves it empty;
            // recovery removes such a file, but should one remain, an empty file with
            // the right name is exactly what we were about to create.
            let file = match std::fs::OpenOptions::new().create_new(true).append(true).open(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && std::fs::metadata(&path)?.len() == 0 => {
                    std::fs::OpenOptions::new().append(true).open(&path)?
                }
                other => other?,
            };
            if self.durability == Durability::Fsync {
                sync_dir(&self.wal_dir)?;
            }
            let rolled = self.active.is_some();
            self.active = Some((first, file, 0));
            self.roll = false;
            created = true;
            if rolled {
                self.faults.hit(fault::SEGMENT_ROLL).map_err(std::io::Error::other)?;
            }
        }
        let Some((segment, file, size)) = self.active.as_mut() else {
            return Err(std::io::Error::other("no active journal segment"));
        };
        let at = *size;
        let mut disk_full = || -> std::io::Result<()> {
            // A full disk takes part of a write: half the group, then ENOSPC.
            if self.faults.hit(fault::DISK_FULL).is_err() {
                file.write_all(&bytes[..bytes.len() / 2])?;
                return Err(std::io::ErrorKind::StorageFull.into());
            }
            Ok(())
        };
        if let Err(e) = disk_full().and_then(|()| file.write_all(bytes)).and_then(|()| match self.durability {
            Durability::Fsync => file.sync_data(),
            Durability::ProcessCrash => Ok(()),
        }) {
            // Part of the group may be on disk: cut it off, so that the segment ends at
            // its last whole entry (a full disk leaves no torn frame behind), and roll.
            let _ = file.set_len(at);
            self.roll = true;
            return Err(e);
        }
        *size += bytes.len() as u64;
        Ok((*segment, at, created))
    }
}
