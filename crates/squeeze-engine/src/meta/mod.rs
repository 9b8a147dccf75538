//! Metadata: the superblock slots, checkpoints of the map, the flush
//! marks, and recovery (newest valid checkpoint + replay of the log after
//! it).

pub mod checkpoint;
pub mod flush_marks;
pub mod load;
pub mod pager;
pub mod recovery;
pub mod superblock;
