//! The copy engine: moves images from a [`crate::source::Source`] to a
//! [`crate::sink::Sink`], verifying every byte, and knows no protocol; and
//! the closure walk that says whether an image is whole where it landed.

pub mod closure;
pub mod copy;
