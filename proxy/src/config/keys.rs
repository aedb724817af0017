//! Keys of the configuration file and when a change to each takes effect.
//!
//! Every section struct is defined with [`section!`], which makes each field a key and makes
//! it choose its [`Reload`] class where it is declared: `live` or `restart` before the field
//! name. A field without one does not compile; [`crate::lifecycle`] reads the classes from
//! here, and its tests check that each key reloads (or not) as declared.

/// When a changed key takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// On SIGHUP, for connections that arrive afterwards.
    Live,
    /// After a restart: a SIGHUP that changes it logs a warning naming the key, and the
    /// running value stays.
    Restart,
}

/// A key of the configuration file: `section.name` and its reload class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    pub reload: Reload,
}

/// Defines a section struct of the file. Each field is a key and starts with its reload
/// class: `live` or `restart`. Fields in a trailing `not_keys { ... }` block are not read from
/// the file (serde skips them) and are no keys. Besides the struct it defines:
///
/// - `KEYS`: the section's keys with their classes, in declaration order;
/// - `changed(&self, &other)`: the keys whose values differ;
/// - `take_live(&mut self, &new)`: the values of the live keys from `new`.
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident in $section:literal {
            $( $(#[$fmeta:meta])* $class:ident $field:ident: $ty:ty, )*
        }
        $( not_keys { $( $(#[$nmeta:meta])* $nfield:ident: $nty:ty, )* } )?
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
            $($( $(#[$nmeta])* #[serde(skip)] pub $nfield: $nty, )*)?
        }

        impl $name {
            /// The keys of this section with their reload classes, in declaration order.
            pub const KEYS: &'static [$crate::config::Key] = &[$(
                $crate::config::Key {
                    name: concat!($section, ".", stringify!($field)),
                    reload: section!(@class $class),
                },
            )*];

            /// The keys whose values differ between `self` and `other`, in declaration order.
            pub fn changed(&self, other: &Self) -> Vec<$crate::config::Key> {
                let differs = [$( self.$field != other.$field ),*];
                Self::KEYS
                    .iter()
                    .zip(differs)
                    .filter_map(|(k, d)| d.then_some(*k))
                    .collect()
            }

            /// Takes the values of the live keys from `new`; the restart keys keep theirs.
            pub fn take_live(&mut self, new: &Self) {
                let _ = new; // a section of restart keys only takes nothing
                $( section!(@take $class self new $field); )*
            }
        }
    };
    (@class live) => { $crate::config::Reload::Live };
    (@class restart) => { $crate::config::Reload::Restart };
    (@take live $s:ident $n:ident $field:ident) => { $s.$field = $n.$field.clone() };
    (@take restart $s:ident $n:ident $field:ident) => { () };
}

pub(crate) use section;
