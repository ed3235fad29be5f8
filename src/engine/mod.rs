//! The copy engine: moves images from a [`crate::source::Source`] to a
//! [`crate::sink::Sink`], verifying every byte, and knows no protocol; and
//! the closure walk that says whether an image is whole where it landed;
//! and what a copy reports.

pub mod closure;
pub mod copy;
pub mod report;
