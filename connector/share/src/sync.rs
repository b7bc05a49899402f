//! The lock helper both backends use: the workspace's one, from `shareflow-checkpoint`.

pub use shareflow_checkpoint::sync::lock;
