//! Build script: bindgen of the system RDMA headers under the `verbs`
//! feature (layout cross-checks); nothing otherwise.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
