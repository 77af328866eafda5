//! The software device's memory-region table: lkey/rkey → region, with
//! protection-domain, bounds and access-flag checks.

use std::vec::Vec;

pub use crate::attr::Access;

/// One registered region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrEntry {
    pub pd: u32,
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    pub key: u32,
    /// False once the rkey is invalidated. Nothing clears it today: a
    /// SEND_WITH_INV is refused (no region here is remotely invalidatable).
    pub remote_valid: bool,
}

/// Keys are `index << 8 | tag`; the tag changes every time a slot is
/// reused, so a stale key never matches a new region.
#[derive(Default)]
pub(crate) struct MrTable {
    slots: Vec<(u8, Option<MrEntry>)>,
    free: Vec<u32>,
}

impl MrTable {
    pub fn insert(&mut self, pd: u32, addr: u64, len: u64, access: Access) -> u32 {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                self.slots.len() as u32 - 1
            }
        };
        let slot = &mut self.slots[idx as usize];
        slot.0 = slot.0.wrapping_add(1);
        // Key 0x100 is MLX5_INVALID_LKEY: skip tags that would produce it.
        if idx == 1 && slot.0 == 0 {
            slot.0 = 1;
        }
        let key = idx << 8 | slot.0 as u32;
        slot.1 = Some(MrEntry {
            pd,
            addr,
            len,
            access,
            key,
            remote_valid: true,
        });
        key
    }

    pub fn remove(&mut self, key: u32) -> bool {
        let idx = key >> 8;
        match self.slots.get_mut(idx as usize) {
            Some((_, e @ Some(_))) if e.map(|m| m.key) == Some(key) => {
                *e = None;
                self.free.push(idx);
                true
            }
            _ => false,
        }
    }

    /// Whether any region of protection domain `pd` is registered.
    pub fn any_in(&self, pd: u32) -> bool {
        self.slots
            .iter()
            .any(|(_, e)| e.is_some_and(|m| m.pd == pd))
    }

    #[inline]
    pub fn get(&self, key: u32) -> Option<&MrEntry> {
        match self.slots.get((key >> 8) as usize) {
            Some((_, Some(e))) if e.key == key => Some(e),
            _ => None,
        }
    }

    /// Checks that `[addr, addr+len)` lies in region `key` of `pd` with
    /// `need` access; returns the host pointer.
    #[inline]
    pub fn check(
        &self,
        key: u32,
        pd: u32,
        addr: u64,
        len: u64,
        need: Access,
        remote: bool,
    ) -> Option<*mut u8> {
        let e = self.get(key)?;
        if e.pd != pd || !e.access.contains(need) || (remote && !e.remote_valid) {
            return None;
        }
        let end = addr.checked_add(len)?;
        if addr < e.addr || end > e.addr + e.len {
            return None;
        }
        Some(addr as usize as *mut u8)
    }
}
