//! Metadata: the superblock slots, checkpoints of the map, and recovery
//! (newest valid checkpoint + replay of the log after it).

pub mod checkpoint;
pub mod load;
pub mod pager;
pub mod recovery;
pub mod superblock;
