//! The copy engine: moves images from a [`crate::source::Source`] to a
//! [`crate::sink::Sink`], verifying every byte, and knows no protocol; and
//! the closure walk that says whether an image is whole where it landed;
//! what a copy reports; and the gate a policy may close before an image
//! is stored.

pub mod closure;
pub mod copy;
pub mod gate;
pub mod report;
