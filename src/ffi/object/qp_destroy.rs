//! Destroying queue pairs: `rdd_qp_destroy`, and `destroy_all` for
//! owners of several QPs that must go together (a mesh).

use std::vec::Vec;

use crate::ffi::status::rdd_status;

use super::h;
use super::objects::{CqObj, QpObj};
use super::table::{excl, Excl};
use super::types::rdd_qp;

/// Destroys a queue pair. Work in flight is abandoned (its completions,
/// if any arrive, are discarded; for a QP on an SRQ, receives it took from
/// the SRQ are still reported while another QP of that SRQ receives on
/// the same CQ, their buffers being the SRQ's). The QP's CQs are used by
/// the call (`RESOURCE_BUSY` while another thread polls them). Once this returns
/// the device no longer touches the buffers of the abandoned work.
#[no_mangle]
pub extern "C" fn rdd_qp_destroy(qp: *mut rdd_qp) -> rdd_status {
    ffi_boundary!({
        let q = try_status!(excl::<QpObj>(h(qp)));
        // Hold the CQs so no poll sees the attached count change.
        let mut scq = try_status!(excl::<CqObj>(q.send_cq));
        let mut rcq = if q.recv_cq != q.send_cq {
            Some(try_status!(excl::<CqObj>(q.recv_cq)))
        } else {
            None
        };
        destroy_held(q, &mut scq, rcq.as_deref_mut());
        rdd_status::Ok
    })
}

/// What `rdd_qp_destroy` does once it holds the QP and its CQs
/// exclusively (`rcq`: the receive CQ if it is not `scq`): unbinds the
/// QP (and its SRQ) from the CQs, then destroys it.
fn destroy_held(q: Excl<QpObj>, scq: &mut CqObj, mut rcq: Option<&mut CqObj>) {
    scq.unbind(q.qpn);
    if let Some(r) = rcq.as_deref_mut() {
        r.unbind(q.qpn);
    }
    if let Some(a) = &q.srq {
        match rcq {
            Some(r) => r.unbind_srq(a.srqn),
            None => scq.unbind_srq(a.srqn),
        }
    }
    q.destroy();
}

/// Destroys every QP of `qps` (handles; already destroyed ones are
/// skipped) or none: each QP and each CQ they use is first taken
/// exclusively, and if any is in use by another call the guards are
/// released and `RESOURCE_BUSY` returned with nothing changed. For
/// owners of several QPs that must go together (`rdd_mesh_destroy`).
pub(in crate::ffi) fn destroy_all(qps: &[usize]) -> Result<(), rdd_status> {
    let mut held = Vec::with_capacity(qps.len());
    for &qh in qps {
        match excl::<QpObj>(qh) {
            Ok(q) => held.push(q),
            // Destroyed already (the QP handles are the caller's too).
            Err(rdd_status::InvalidHandle) => {}
            Err(e) => return Err(e),
        }
    }
    let mut cqs: Vec<(usize, Excl<CqObj>)> = Vec::new();
    for q in &held {
        for c in [q.send_cq, q.recv_cq] {
            if !cqs.iter().any(|(h, _)| *h == c) {
                cqs.push((c, excl::<CqObj>(c)?));
            }
        }
    }
    // Everything is held: nothing can fail from here on.
    for q in held {
        let find = |h: usize| cqs.iter().position(|(c, _)| *c == h);
        let (Some(si), Some(ri)) = (find(q.send_cq), find(q.recv_cq)) else {
            // Every CQ of a held QP was taken above.
            continue;
        };
        if si == ri {
            destroy_held(q, &mut cqs[si].1, None);
        } else {
            let (lo, hi) = cqs.split_at_mut(si.max(ri));
            let (a, b) = (&mut lo[si.min(ri)].1, &mut hi[0].1);
            let (scq, rcq) = if si < ri { (a, b) } else { (b, a) };
            destroy_held(q, scq, Some(rcq));
        }
    }
    Ok(())
}
