//! `{{ field }}` templates, such as Kafka topics `app-{{ level }}`: the one
//! template engine lives in `petrel_core::template` (the `text` encoding
//! renders its line templates there too).

pub use petrel_core::template::{RenderOptions, Template};
