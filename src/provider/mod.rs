//! Provider codecs and queues. mlx5 first; rxe and siw follow.

pub mod mlx5;
pub mod rxe;
pub mod siw;
