//! Shared pieces of the rdma-direct fuzz targets.
//!
//! - [`Bytes`]: a tiny, stable input format. Targets read their input as
//!   a stream of little-endian integers; reading past the end yields
//!   zeros, so every byte string is a valid input. [`SeedWriter`] writes
//!   the same format, which keeps the committed seeds readable and stable
//!   (no dependency on another crate's encoding).
//! - [`send`]: an independent model of the send-WR rules: which typed
//!   errors a work request deserves, and the WQE it must become. It is
//!   written from the documented rules (`wr.rs`, docs/spec/mlx5.md §2–§5 and
//!   `mlx5dv.h`) and never calls the crate's validation or encoder.
//! - [`rules`]: the same rules as an ordered model (the one error a post
//!   reports), for the lean `wr_check` target.
//! - [`pattern`]: position-dependent fill bytes, so a stray write of any
//!   value is visible.
//!
//! The seeds under `fuzz/seeds/` are produced by the tests at the end of
//! this file: `RDD_WRITE_SEEDS=1 cargo +"$RDD_NIGHTLY" test` rewrites them,
//! and a plain `cargo +"$RDD_NIGHTLY" test` checks the committed files are
//! current (`RDD_NIGHTLY`: the pinned nightly, `scripts/toolchains.sh`).

#![forbid(unsafe_code)]

/// Reads the fuzz input: little-endian integers and byte runs. Past the end
/// every read returns zero (or an empty run).
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data, pos: 0 }
    }

    /// True once every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = end;
        &self.data[start..end]
    }

    fn fixed<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let got = self.take(N);
        out[..got.len()].copy_from_slice(got);
        out
    }

    /// One byte.
    pub fn u8(&mut self) -> u8 {
        self.fixed::<1>()[0]
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.fixed())
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.fixed())
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.fixed())
    }

    /// Exactly `N` bytes, zero-padded at the end of the input.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        self.fixed()
    }
}

/// Writes inputs in the format [`Bytes`] reads (for seeds).
#[derive(Default)]
pub struct SeedWriter {
    out: Vec<u8>,
}

impl SeedWriter {
    /// An empty input.
    pub fn new() -> SeedWriter {
        SeedWriter::default()
    }
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }
    /// A little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.out.extend_from_slice(v);
        self
    }
    /// The finished input.
    pub fn finish(&self) -> Vec<u8> {
        self.out.clone()
    }
}

/// Fill patterns.
pub mod pattern {
    /// The pattern byte at position `i` for seed `seed`: every byte of a
    /// buffer differs from its neighbours, so a shifted or misplaced write
    /// shows up even when it writes a "plausible" value.
    pub fn byte(seed: u8, i: usize) -> u8 {
        let x = (i as u32).wrapping_mul(0x9e37_79b1) ^ (seed as u32).wrapping_mul(0x85eb_ca6b);
        (x ^ (x >> 15) ^ (x >> 24)) as u8
    }

    /// Fills `buf` with the pattern.
    pub fn fill(buf: &mut [u8], seed: u8) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = byte(seed, i);
        }
    }
}

/// Independent model of send work requests.
pub mod send {
    use rdma_direct::provider::mlx5::QpState;
    use rdma_direct::wr::MwBind;
    use rdma_direct::{Error, QpCaps, Remote, SendFlags, SendOp, SendWr, Sge};

    use crate::Bytes;

    /// mlx5 send opcodes, from `mlx5dv.h` (`MLX5_OPCODE_*`).
    pub mod mlx5_op {
        /// `MLX5_OPCODE_NOP`.
        pub const NOP: u8 = 0x00;
        /// `MLX5_OPCODE_SEND_INVAL`.
        pub const SEND_INVAL: u8 = 0x01;
        /// `MLX5_OPCODE_RDMA_WRITE`.
        pub const RDMA_WRITE: u8 = 0x08;
        /// `MLX5_OPCODE_RDMA_WRITE_IMM`.
        pub const RDMA_WRITE_IMM: u8 = 0x09;
        /// `MLX5_OPCODE_SEND`.
        pub const SEND: u8 = 0x0a;
        /// `MLX5_OPCODE_SEND_IMM`.
        pub const SEND_IMM: u8 = 0x0b;
        /// `MLX5_OPCODE_RDMA_READ`.
        pub const RDMA_READ: u8 = 0x10;
        /// `MLX5_OPCODE_ATOMIC_CS`.
        pub const ATOMIC_CS: u8 = 0x11;
        /// `MLX5_OPCODE_ATOMIC_FA`.
        pub const ATOMIC_FA: u8 = 0x12;
    }

    /// `fm_ce_se` bits (`MLX5_WQE_CTRL_*`).
    pub mod ctrl {
        /// `MLX5_WQE_CTRL_CQ_UPDATE`.
        pub const CQ_UPDATE: u8 = 0x08;
        /// `MLX5_WQE_CTRL_SOLICITED`.
        pub const SOLICITED: u8 = 0x02;
        /// `MLX5_WQE_CTRL_FENCE` (fence mode 4).
        pub const FENCE: u8 = 0x80;
    }

    /// RDMA's message limit: 2^31 bytes.
    pub const MAX_MESSAGE: u64 = 1 << 31;
    /// The DS field is 6 bits.
    pub const MAX_DS: u32 = 63;

    /// Owned storage for a send WR's payload.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum PayloadSpec {
        /// Gather/scatter list.
        Sges(Vec<Sge>),
        /// Inline pieces.
        Inline(Vec<Vec<u8>>),
    }

    /// An owned send WR; [`WrSpec::with_wr`] lends it as a [`SendWr`].
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct WrSpec {
        /// The WR id.
        pub wr_id: u64,
        /// The operation.
        pub op: SendOp,
        /// Flags (any bits).
        pub flags: SendFlags,
        /// Payload.
        pub payload: PayloadSpec,
    }

    impl WrSpec {
        /// Calls `f` with the borrowed [`SendWr`].
        pub fn with_wr<R>(&self, f: impl FnOnce(&SendWr<'_>) -> R) -> R {
            match &self.payload {
                PayloadSpec::Sges(s) => f(&SendWr::new(self.wr_id, self.op, s, self.flags)),
                PayloadSpec::Inline(pieces) => {
                    let refs: Vec<&[u8]> = pieces.iter().map(|p| p.as_slice()).collect();
                    f(&SendWr::inline(self.wr_id, self.op, &refs, self.flags))
                }
            }
        }

        /// Total inline bytes.
        pub fn inline_len(&self) -> Option<usize> {
            match &self.payload {
                PayloadSpec::Inline(p) => Some(p.iter().map(|x| x.len()).sum()),
                PayloadSpec::Sges(_) => None,
            }
        }

        /// The concatenated inline payload.
        pub fn inline_bytes(&self) -> Vec<u8> {
            match &self.payload {
                PayloadSpec::Inline(p) => p.concat(),
                PayloadSpec::Sges(_) => Vec::new(),
            }
        }
    }

    /// The nine operations, in input order.
    pub const OP_KINDS: u8 = 11;

    /// Builds operation number `kind % 11` with fields read from `r`;
    /// `align` forces the remote address of atomics to 8 bytes.
    pub fn read_op(r: &mut Bytes<'_>, kind: u8, align: bool) -> SendOp {
        let remote = |r: &mut Bytes<'_>, atomic: bool| {
            let mut addr = r.u64();
            if atomic && align {
                addr &= !7;
            }
            Remote::new(addr, r.u32())
        };
        match kind % OP_KINDS {
            0 => SendOp::Send,
            1 => SendOp::SendImm { imm: r.u32() },
            2 => SendOp::SendInv { rkey: r.u32() },
            3 => SendOp::Write {
                remote: remote(r, false),
            },
            4 => SendOp::WriteImm {
                remote: remote(r, false),
                imm: r.u32(),
            },
            5 => SendOp::Read {
                remote: remote(r, false),
            },
            6 => SendOp::CompareSwap {
                remote: remote(r, true),
                compare: r.u64(),
                swap: r.u64(),
            },
            7 => SendOp::FetchAdd {
                remote: remote(r, true),
                add: r.u64(),
            },
            9 => SendOp::BindMw(MwBind {
                addr: r.u64(),
                len: r.u64(),
                mr_lkey: r.u32(),
                mw_rkey: r.u32(),
                new_rkey: r.u32(),
                access: r.u32(),
            }),
            10 => SendOp::LocalInv { rkey: r.u32() },
            _ => SendOp::Nop,
        }
    }

    /// An SGE length from a one-byte code: mostly small values and 8 (the
    /// atomic size), plus the interesting boundaries of the 2^31 limit.
    pub fn read_len(r: &mut Bytes<'_>) -> u32 {
        match r.u8() % 10 {
            0 => 0,
            1 | 2 => 8,
            3 | 4 => r.u8() as u32,
            5 => r.u16() as u32,
            6 => r.u32(),
            7 => 0x4000_0000,
            8 => 0x7fff_ffff,
            _ => 0x8000_0000,
        }
    }

    /// Reads a whole send WR for `wqe_encode`: SGE addresses and lkeys are
    /// arbitrary (nothing reads them in that target).
    pub fn read_wr(r: &mut Bytes<'_>) -> WrSpec {
        let ctl = r.u8();
        let kind = ctl & 0x0f;
        let align = ctl & 0x10 != 0;
        let flags = if ctl & 0x20 != 0 {
            SendFlags(r.u32())
        } else {
            SendFlags((r.u8() & 0x0f) as u32)
        };
        let op = read_op(r, kind, align);
        let wr_id = r.u64();
        let pl = r.u8();
        let n = (pl & 0x0f) as usize;
        let payload = if pl & 0x80 != 0 {
            let mut pieces = Vec::with_capacity(n);
            for _ in 0..n {
                let len = r.u8() as usize;
                pieces.push(r.take(len).to_vec());
            }
            PayloadSpec::Inline(pieces)
        } else {
            let mut sges = Vec::with_capacity(n);
            for _ in 0..n {
                let length = read_len(r);
                sges.push(Sge::new(r.u64(), length, r.u32()));
            }
            PayloadSpec::Sges(sges)
        };
        WrSpec {
            wr_id,
            op,
            flags,
            payload,
        }
    }

    /// Opcode and header octowords (ctrl, raddr, atomic) of an operation.
    pub fn opcode_and_hdr(op: &SendOp) -> (u8, u32) {
        match op {
            SendOp::Send => (mlx5_op::SEND, 1),
            SendOp::SendImm { .. } => (mlx5_op::SEND_IMM, 1),
            SendOp::SendInv { .. } => (mlx5_op::SEND_INVAL, 1),
            SendOp::Write { .. } => (mlx5_op::RDMA_WRITE, 2),
            SendOp::WriteImm { .. } => (mlx5_op::RDMA_WRITE_IMM, 2),
            SendOp::Read { .. } => (mlx5_op::RDMA_READ, 2),
            SendOp::CompareSwap { .. } => (mlx5_op::ATOMIC_CS, 3),
            SendOp::FetchAdd { .. } => (mlx5_op::ATOMIC_FA, 3),
            SendOp::Nop => (mlx5_op::NOP, 1),
            // Refused before anything is written (the mlx5 encoder has no
            // memory-window WQEs); sized as a NOP where a size is asked.
            SendOp::BindMw(_) | SendOp::LocalInv { .. } => (mlx5_op::NOP, 1),
        }
    }

    fn is_atomic(op: &SendOp) -> bool {
        matches!(op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// The SGEs that must appear in the WQE, as (addr, len, lkey):
    /// zero-length entries are skipped, an atomic's single entry is 8.
    pub fn expected_sges(w: &WrSpec) -> Vec<(u64, u32, u32)> {
        match &w.payload {
            PayloadSpec::Sges(s) if is_atomic(&w.op) => vec![(s[0].addr, 8, s[0].lkey)],
            PayloadSpec::Sges(s) => s
                .iter()
                .filter(|e| e.length != 0)
                .map(|e| (e.addr, e.length, e.lkey))
                .collect(),
            PayloadSpec::Inline(_) => Vec::new(),
        }
    }

    /// The WQE size in octowords (meaningful for any WR, valid or not).
    pub fn ds(w: &WrSpec) -> u32 {
        let (_, hdr) = opcode_and_hdr(&w.op);
        let data = match &w.payload {
            PayloadSpec::Sges(s) if is_atomic(&w.op) => s.len().min(1) as u32,
            PayloadSpec::Sges(s) => s.iter().filter(|e| e.length != 0).count() as u32,
            PayloadSpec::Inline(p) => {
                let len: usize = p.iter().map(|x| x.len()).sum();
                if len == 0 {
                    0
                } else {
                    (4 + len as u32).div_ceil(16)
                }
            }
        };
        hdr + data
    }

    /// WQE size in 64-byte basic blocks.
    pub fn nbb(w: &WrSpec) -> u32 {
        ds(w).div_ceil(4)
    }

    /// Every rule `w` breaks, as the typed error that names it. Empty means
    /// the WR must be accepted. `outstanding` and `wqe_cnt` are in BBs.
    pub fn violations(
        w: &WrSpec,
        caps: &QpCaps,
        state: QpState,
        outstanding: u32,
        wqe_cnt: u32,
    ) -> Vec<Error> {
        let mut v = Vec::new();
        if !matches!(state, QpState::Rts | QpState::Error) {
            v.push(Error::InvalidQpState);
        }
        if matches!(w.op, SendOp::BindMw(_) | SendOp::LocalInv { .. }) {
            v.push(Error::Unsupported);
        }
        let atomic = is_atomic(&w.op);
        match &w.payload {
            PayloadSpec::Sges(s) => {
                if s.len() > caps.max_send_sge as usize {
                    v.push(Error::TooManySges);
                }
                if w.op.is_dataless() && !s.is_empty() {
                    v.push(Error::TooManySges);
                }
                if atomic && !(s.len() == 1 && s[0].length == 8) {
                    v.push(Error::AtomicSgeLength);
                }
                let total: u64 = s.iter().map(|e| e.length as u64).sum();
                if total > MAX_MESSAGE {
                    v.push(Error::LengthOverflow);
                }
                // A data segment's byte count has 31 bits: bit 31 is
                // `MLX5_INLINE_SEG`, so a pointer segment of 2^31 bytes or
                // more would read back as an inline segment.
                if !atomic && s.iter().any(|e| e.length >= 1 << 31) {
                    v.push(Error::LengthOverflow);
                }
            }
            PayloadSpec::Inline(p) => {
                if matches!(
                    w.op,
                    SendOp::Read { .. }
                        | SendOp::CompareSwap { .. }
                        | SendOp::FetchAdd { .. }
                        | SendOp::Nop
                        | SendOp::BindMw(_)
                        | SendOp::LocalInv { .. }
                ) {
                    v.push(Error::InlineNotAllowed);
                }
                let len: usize = p.iter().map(|x| x.len()).sum();
                if len as u64 > caps.max_inline_data as u64 {
                    v.push(Error::InlineTooLarge);
                }
                if len as u64 > MAX_MESSAGE {
                    v.push(Error::LengthOverflow);
                }
            }
        }
        if let Some(remote) = w.op.remote() {
            if atomic && remote.addr % 8 != 0 {
                v.push(Error::AtomicUnaligned);
            }
        }
        if ds(w) > MAX_DS {
            v.push(Error::TooManySges);
        }
        if outstanding + nbb(w) > wqe_cnt {
            v.push(Error::SqFull);
        }
        v
    }

    /// The immediate field of the control segment (host order).
    /// Checks the parts of a decoded WQE that follow from the WR alone:
    /// immediate, remote address, atomic operands, data segments (zero-length
    /// ones skipped, atomics forced to 8 bytes) and inline payload.
    pub fn check_payload(d: &rdma_direct::testutil::DecodedWqe, w: &WrSpec) {
        assert_eq!(d.imm, imm(&w.op), "imm of {w:?}");
        assert_eq!(
            d.remote,
            w.op.remote().map(|r| (r.addr, r.rkey)),
            "remote of {w:?}"
        );
        assert_eq!(d.atomic, atomic_fields(&w.op), "atomic operands of {w:?}");
        assert_eq!(d.sges, expected_sges(w), "SGEs of {w:?}");
        let inline = match w.inline_len() {
            Some(n) if n > 0 => Some(w.inline_bytes()),
            _ => None,
        };
        assert_eq!(d.inline, inline, "inline payload of {w:?}");
    }

    pub fn imm(op: &SendOp) -> u32 {
        match *op {
            SendOp::SendImm { imm } | SendOp::WriteImm { imm, .. } => imm,
            SendOp::SendInv { rkey } => rkey,
            _ => 0,
        }
    }

    /// (swap_add, compare) as the decoder reports them.
    pub fn atomic_fields(op: &SendOp) -> Option<(u64, Option<u64>)> {
        match *op {
            SendOp::CompareSwap { compare, swap, .. } => Some((swap, Some(compare))),
            SendOp::FetchAdd { add, .. } => Some((add, None)),
            _ => None,
        }
    }

    /// Largest WQE (octowords) a queue with `caps` can be asked to build.
    pub fn max_wqe_ds(caps: &QpCaps) -> u32 {
        let sges = 2 + caps.max_send_sge; // ctrl + raddr + SGEs (RDMA)
        let inline = 2 + (4 + caps.max_inline_data).div_ceil(16); // ctrl + raddr + inline
        let atomic = 4; // ctrl + raddr + atomic + one SGE
        sges.max(inline).max(atomic)
    }

    /// Whether a send queue of `wqe_cnt` BBs must accept `caps`: every WQE
    /// it may build fits the DS field and the ring.
    pub fn geometry_ok(caps: &QpCaps, wqe_cnt: u32) -> bool {
        let m = max_wqe_ds(caps);
        m <= MAX_DS && m.div_ceil(4) <= wqe_cnt
    }
}

pub mod rules;

#[cfg(test)]
mod regressions;
#[cfg(test)]
mod seeds;
#[cfg(test)]
mod seeds_lean;
