//! The write pipeline, one stage per module, in data-path order:
//! [`split`] (sectors -> zero runs and blobs) -> [`policy`] (mode, hints,
//! required ratio; [`adapt`]: the rung of the codec ladder under load,
//! from the engine's backlog and [`headroom`], the machine's busy CPU, each
//! through a [`law`] that [`cost`]'s model of each rung's CPU at the
//! client's rate keeps from probes bound to fail, down to storing raw
//! while [`burst`]'s room rule allows) ->
//! [`compress`] (batch through the compression engine).
//! The volume then appends the encoded blobs to the log.

pub mod adapt;
pub mod burst;
pub mod compress;
pub mod cost;
pub mod headroom;
pub mod law;
pub mod policy;
pub mod split;
pub mod trial;
