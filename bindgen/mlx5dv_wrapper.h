/*
 * Input for bindgen under the `verbs` feature (see build.rs). Only the
 * public mlx5 direct-verbs header is needed; build.rs allowlists the few
 * structs and the MLX5_* constants that tests/layout_bindgen.rs compares
 * with the hand-written layouts in src/provider/mlx5/layout.rs.
 */
#include <infiniband/mlx5dv.h>
