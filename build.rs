//! Build script: bindgen of the system RDMA headers under the `verbs`
//! feature (layout cross-checks, and the kernel uverbs ABI that the rxe/siw
//! queue creation in `src/verbs/uverbs/` speaks); nothing otherwise. The
//! wrapper headers handed to libclang are in `bindgen/`.
//!
//! Default builds never touch libclang or rdma-core: the bindgen code below
//! is compiled only with the `verbs` feature (the `bindgen` build-dependency
//! is optional and enabled by it) and runs only when Cargo reports that
//! feature through `CARGO_FEATURE_VERBS`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");

    #[cfg(feature = "verbs")]
    if std::env::var_os("CARGO_FEATURE_VERBS").is_some() {
        mlx5dv::generate();
        uverbs::generate();
        // The mlx5 direct path calls libmlx5 (mlx5dv_init_obj,
        // mlx5dv_create_qp, mlx5dv_is_supported); libibverbs-dev ships it.
        println!("cargo:rustc-link-lib=dylib=mlx5");
    }
}

/// bindgen of `infiniband/mlx5dv.h` into `$OUT_DIR/mlx5dv_sys.rs`, included
/// by `src/sys/mod.rs`.
#[cfg(feature = "verbs")]
mod mlx5dv {
    use std::env;
    use std::path::PathBuf;

    /// The wrapper header handed to libclang (it only includes mlx5dv.h).
    const WRAPPER: &str = "bindgen/mlx5dv_wrapper.h";

    /// Directory holding `infiniband/mlx5dv.h` when it is not on the
    /// compiler's default include path (e.g. an rdma-core build tree).
    const INCLUDE_DIR_ENV: &str = "RDMA_DIRECT_INCLUDE_DIR";

    /// The structs cross-checked by `tests/layout_bindgen.rs`
    /// (docs/spec/mlx5.md §1, §3, §8, §10). Types they use are pulled in as needed.
    const TYPES: &[&str] = &[
        "mlx5_wqe_ctrl_seg",
        "mlx5_wqe_raddr_seg",
        "mlx5_wqe_data_seg",
        "mlx5_wqe_atomic_seg",
        "mlx5_wqe_inl_data_seg",
        "mlx5_cqe64",
        "mlx5_err_cqe",
        "mlx5dv_qp",
        "mlx5dv_cq",
        "mlx5dv_obj",
        "mlx5dv_qp_init_attr",
        "mlx5dv_obj_type",
        "mlx5dv_qp_create_flags",
        "mlx5dv_qp_init_attr_mask",
    ];

    /// Runs bindgen; panics with a hint when the header cannot be parsed.
    pub(super) fn generate() {
        println!("cargo:rerun-if-changed={WRAPPER}");
        println!("cargo:rerun-if-env-changed={INCLUDE_DIR_ENV}");

        let mut builder = bindgen::Builder::default()
            .header(WRAPPER)
            .use_core()
            .ctypes_prefix("core::ffi")
            .layout_tests(true)
            .generate_comments(false)
            // The C struct is `packed` + `aligned(4)` with a u16 at offset 9;
            // Rust's `packed(4)` would move it to offset 10 and grow the
            // struct to 20 bytes (docs/spec/mlx5.md §10), so keep it as a 16-byte,
            // 4-aligned blob and check the hand-written segment against it.
            .opaque_type("mlx5_wqe_ctrl_seg")
            // The anonymous `enum { MLX5_... }` constants of mlx5dv.h.
            .allowlist_var("MLX5_.*")
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for ty in TYPES {
            builder = builder.allowlist_type(ty);
        }
        if let Some(dir) = env::var_os(INCLUDE_DIR_ENV) {
            builder = builder.clang_arg(format!("-I{}", PathBuf::from(dir).display()));
        }

        let bindings = builder.generate().unwrap_or_else(|e| {
            panic!(
                "bindgen of infiniband/mlx5dv.h failed ({e}); the `verbs` feature needs \
                 libclang and the rdma-core headers (libibverbs-dev), or set \
                 {INCLUDE_DIR_ENV} to the directory containing infiniband/mlx5dv.h"
            )
        });

        let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by Cargo"))
            .join("mlx5dv_sys.rs");
        bindings
            .write_to_file(&out)
            .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}

/// bindgen of the kernel's uverbs UAPI (`rdma/ib_user_verbs.h`, plus the QP
/// type enum of `rdma/ib_user_ioctl_verbs.h`) and the rxe
/// and siw driver ABIs (`rdma/rdma_user_rxe.h`, `rdma/siw-abi.h`) into
/// `$OUT_DIR/uverbs_sys.rs`, included by `src/sys/uverbs.rs`. The headers
/// come from the kernel's UAPI export (Debian: `linux-libc-dev`).
#[cfg(feature = "verbs")]
mod uverbs {
    use std::env;
    use std::path::PathBuf;

    /// The wrapper header handed to libclang (it includes the three UAPI
    /// headers and nothing else).
    const WRAPPER: &str = "bindgen/uverbs_wrapper.h";

    /// Directory holding `rdma/ib_user_verbs.h` when it is not on the
    /// compiler's default include path (shared with the mlx5dv bindings).
    const INCLUDE_DIR_ENV: &str = "RDMA_DIRECT_INCLUDE_DIR";

    /// The command layouts, driver responses and ring headers the uverbs
    /// layer uses (docs/spec/rxe.md §1, §2, docs/spec/siw.md §1, §2, docs/spec/kernels.md). Types they use
    /// are pulled in as needed.
    const TYPES: &[&str] = &[
        "ib_uverbs_cmd_hdr",
        "ib_uverbs_create_comp_channel",
        "ib_uverbs_create_comp_channel_resp",
        "ib_uverbs_create_cq",
        "ib_uverbs_create_cq_resp",
        "ib_uverbs_destroy_cq",
        "ib_uverbs_destroy_cq_resp",
        "ib_uverbs_req_notify_cq",
        "ib_uverbs_create_qp",
        "ib_uverbs_create_qp_resp",
        "ib_uverbs_qp_dest",
        "ib_uverbs_modify_qp",
        "ib_uverbs_query_qp",
        "ib_uverbs_query_qp_resp",
        "ib_uverbs_destroy_qp",
        "ib_uverbs_destroy_qp_resp",
        "ib_uverbs_post_send",
        "ib_uverbs_post_send_resp",
        "ib_uverbs_create_srq",
        "ib_uverbs_create_srq_resp",
        "ib_uverbs_modify_srq",
        "ib_uverbs_query_srq",
        "ib_uverbs_query_srq_resp",
        "ib_uverbs_destroy_srq",
        "ib_uverbs_destroy_srq_resp",
        "ib_uverbs_create_ah",
        "ib_uverbs_create_ah_resp",
        "ib_uverbs_destroy_ah",
        "ib_uverbs_async_event_desc",
        "ib_uverbs_comp_event_desc",
        "mminfo",
        "rxe_create_ah_resp",
        "rxe_create_cq_resp",
        "rxe_create_qp_resp",
        "rxe_create_srq_resp",
        "rxe_modify_srq_cmd",
        "rxe_queue_buf",
        "rxe_send_wqe",
        "rxe_recv_wqe",
        "ib_uverbs_wc",
        "siw_uresp_create_cq",
        "siw_uresp_create_qp",
        "siw_uresp_create_srq",
        "siw_sqe",
        "siw_rqe",
        "siw_cqe",
        "siw_cq_ctrl",
    ];

    /// Enums bound as modules of constants (`ib_uverbs_write_cmds::X`).
    const ENUMS: &[&str] = &["ib_uverbs_write_cmds", "ib_uverbs_qp_type"];

    /// Runs bindgen; panics with a hint when the headers cannot be parsed.
    pub(super) fn generate() {
        println!("cargo:rerun-if-changed={WRAPPER}");
        println!("cargo:rerun-if-env-changed={INCLUDE_DIR_ENV}");

        let mut builder = bindgen::Builder::default()
            .header(WRAPPER)
            .use_core()
            .ctypes_prefix("core::ffi")
            .layout_tests(true)
            .generate_comments(false)
            .derive_default(true)
            // `SIW_INVAL_UOBJ_KEY`: a driver key meaning "no mapping".
            .allowlist_var("SIW_INVAL_UOBJ_KEY")
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for ty in TYPES {
            builder = builder.allowlist_type(ty);
        }
        for en in ENUMS {
            builder = builder.allowlist_type(en).constified_enum_module(en);
        }
        if let Some(dir) = env::var_os(INCLUDE_DIR_ENV) {
            builder = builder.clang_arg(format!("-I{}", PathBuf::from(dir).display()));
        }

        let bindings = builder.generate().unwrap_or_else(|e| {
            panic!(
                "bindgen of rdma/ib_user_verbs.h, rdma/rdma_user_rxe.h and rdma/siw-abi.h \
                 failed ({e}); the `verbs` feature needs libclang and the kernel UAPI headers \
                 (linux-libc-dev), or set {INCLUDE_DIR_ENV} to the directory containing rdma/"
            )
        });

        let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by Cargo"))
            .join("uverbs_sys.rs");
        bindings
            .write_to_file(&out)
            .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}
