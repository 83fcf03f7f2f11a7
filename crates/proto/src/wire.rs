//! How values are encoded, declared once per type.
//!
//! [`Wire`] is implemented for the primitives of [`crate::codec`] and for the containers built
//! from them (`Option`, `Vec`, pairs). A message struct states its fields once, in wire order,
//! with [`wire_struct!`]; the macro writes both directions, so encoding and decoding cannot
//! drift apart. [`wire_enum!`] does the same for enums: one table of tags and variants gives
//! the type, its encoder and its decoder.

use crate::codec::{DecodeError, Reader, Writer};

/// A value with a binary form.
pub trait Wire: Sized {
    /// Fewest bytes any value of this type takes on the wire (bounds forged counts).
    const MIN_BYTES: usize;

    fn write(&self, w: &mut Writer);

    fn read(r: &mut Reader) -> Result<Self, DecodeError>;
}

macro_rules! wire_primitive {
    ($($type:ty => $write:ident, $read:ident, $bytes:expr;)*) => {$(
        impl Wire for $type {
            const MIN_BYTES: usize = $bytes;

            fn write(&self, w: &mut Writer) {
                w.$write(*self);
            }

            fn read(r: &mut Reader) -> Result<Self, DecodeError> {
                r.$read()
            }
        }
    )*};
}

wire_primitive! {
    u8 => u8, u8, 1;
    u16 => u16, u16, 2;
    u32 => u32, u32, 4;
    u64 => u64, u64, 8;
    i32 => i32, i32, 4;
    i64 => i64, i64, 8;
    bool => bool, bool, 1;
}

impl Wire for String {
    const MIN_BYTES: usize = 4;

    fn write(&self, w: &mut Writer) {
        w.str(self);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        r.string()
    }
}

/// A byte string (the secret of a `Hello`): `u32` length, then the bytes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Bytes(pub Vec<u8>);

impl Wire for Bytes {
    const MIN_BYTES: usize = 4;

    fn write(&self, w: &mut Writer) {
        w.bytes(&self.0);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Bytes(r.bytes()?.to_vec()))
    }
}

impl<T: Wire> Wire for Option<T> {
    const MIN_BYTES: usize = 1;

    fn write(&self, w: &mut Writer) {
        match self {
            Some(value) => {
                w.u8(1);
                value.write(w);
            }
            None => {
                w.u8(0);
            }
        }
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        if r.bool()? { Ok(Some(T::read(r)?)) } else { Ok(None) }
    }
}

impl<T: Wire> Wire for Vec<T> {
    const MIN_BYTES: usize = 4;

    fn write(&self, w: &mut Writer) {
        w.u32(self.len() as u32);
        for item in self {
            item.write(w);
        }
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let count = r.count(T::MIN_BYTES)?;
        (0..count).map(|_| T::read(r)).collect()
    }
}

impl<T: Wire> Wire for Box<T> {
    const MIN_BYTES: usize = T::MIN_BYTES;

    fn write(&self, w: &mut Writer) {
        self.as_ref().write(w);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        T::read(r).map(Box::new)
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    const MIN_BYTES: usize = A::MIN_BYTES + B::MIN_BYTES;

    fn write(&self, w: &mut Writer) {
        self.0.write(w);
        self.1.write(w);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok((A::read(r)?, B::read(r)?))
    }
}

/// Declares a newtype over a primitive (an id that must not be mixed up with other numbers)
/// with the primitive's binary form. It displays in hex (an id), or in decimal when declared
/// `Name(u64) in decimal;` (a count or a position).
#[macro_export]
macro_rules! wire_newtype {
    ($(#[$meta:meta])* $name:ident($inner:ty);) => {
        $crate::wire_newtype!(@type $(#[$meta])* $name($inner));

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{:x}", self.0)
            }
        }

        impl std::fmt::LowerHex for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
    ($(#[$meta:meta])* $name:ident($inner:ty) in decimal;) => {
        $crate::wire_newtype!(@type $(#[$meta])* $name($inner));

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.0, f)
            }
        }
    };
    (@type $(#[$meta:meta])* $name:ident($inner:ty)) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub $inner);

        impl $crate::wire::Wire for $name {
            const MIN_BYTES: usize = <$inner as $crate::wire::Wire>::MIN_BYTES;

            fn write(&self, w: &mut $crate::codec::Writer) {
                self.0.write(w);
            }

            fn read(r: &mut $crate::codec::Reader) -> Result<Self, $crate::codec::DecodeError> {
                Ok($name(<$inner as $crate::wire::Wire>::read(r)?))
            }
        }
    };
}

/// Implements [`Wire`] for a struct: its fields, in the order listed, one after the other.
#[macro_export]
macro_rules! wire_struct {
    ($name:ident { $($field:ident),* $(,)? }) => {
        impl $crate::wire::Wire for $name {
            // Every field takes at least one byte on the wire.
            const MIN_BYTES: usize = <[&str]>::len(&[$(stringify!($field)),*]);

            fn write(&self, w: &mut $crate::codec::Writer) {
                $( $crate::wire::Wire::write(&self.$field, w); )*
            }

            fn read(r: &mut $crate::codec::Reader) -> Result<Self, $crate::codec::DecodeError> {
                Ok($name { $( $field: $crate::wire::Wire::read(r)?, )* })
            }
        }
    };
}

/// Declares an enum whose variants carry at most one value, with its wire form: a one-byte
/// tag (from the table) followed by the value. Generates the type, `encode`, `decode` and a
/// [`Wire`] implementation.
#[macro_export]
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$variant_meta:meta])* $tag:literal => $variant:ident $(($payload:ty))? ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub enum $name {
            $( $(#[$variant_meta])* $variant $(($payload))? ),*
        }

        impl $crate::wire::Wire for $name {
            const MIN_BYTES: usize = 1;

            fn write(&self, w: &mut $crate::codec::Writer) {
                match self {
                    $( $crate::wire_enum!(@pattern $name $variant value $(($payload))?) => {
                        w.u8($tag);
                        $crate::wire_enum!(@write w value $(($payload))?);
                    } )*
                }
            }

            fn read(r: &mut $crate::codec::Reader) -> Result<Self, $crate::codec::DecodeError> {
                Ok(match r.u8()? {
                    $( $tag => $crate::wire_enum!(@read r $name $variant $(($payload))?), )*
                    other => return Err($crate::codec::DecodeError::UnknownMessage(other)),
                })
            }
        }
    };
    (@pattern $name:ident $variant:ident $value:ident ($payload:ty)) => { $name::$variant($value) };
    (@pattern $name:ident $variant:ident $value:ident) => { $name::$variant };
    (@write $w:ident $value:ident ($payload:ty)) => { $crate::wire::Wire::write($value, $w) };
    (@write $w:ident $value:ident) => { () };
    (@read $r:ident $name:ident $variant:ident ($payload:ty)) => { $name::$variant(<$payload as $crate::wire::Wire>::read($r)?) };
    (@read $r:ident $name:ident $variant:ident) => { $name::$variant };
}

/// Encodes `value` alone into `out`.
pub fn encode_into<T: Wire>(value: &T, out: &mut Vec<u8>) {
    value.write(&mut Writer::new(out));
}

/// Decodes a value that must take exactly the whole of `bytes`.
pub fn decode_whole<T: Wire>(bytes: &[u8]) -> Result<T, DecodeError> {
    let mut reader = Reader::new(bytes);
    let value = T::read(&mut reader)?;
    reader.finish()?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Sample {
        pub number: u64,
        pub name: String,
        pub maybe: Option<u32>,
        pub list: Vec<(u8, bool)>,
    }
    wire_struct!(Sample { number, name, maybe, list });

    wire_enum! {
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Choice {
            1 => Nothing,
            2 => Something(Sample),
            7 => Number(u16),
        }
    }

    #[test]
    fn structs_and_enums_round_trip() {
        let sample = Sample { number: 7, name: "seven".into(), maybe: Some(3), list: vec![(1, true), (2, false)] };
        for choice in [Choice::Nothing, Choice::Something(sample), Choice::Number(9)] {
            let mut bytes = Vec::new();
            encode_into(&choice, &mut bytes);
            assert_eq!(decode_whole::<Choice>(&bytes), Ok(choice));
        }
        assert_eq!(decode_whole::<Choice>(&[3]), Err(DecodeError::UnknownMessage(3)));
        assert!(decode_whole::<Choice>(&[1, 0]).is_err(), "trailing bytes");
    }

    #[test]
    fn forged_lengths_are_refused_before_allocating() {
        let mut bytes = Vec::new();
        Writer::new(&mut bytes).u32(u32::MAX);
        assert!(decode_whole::<Vec<u64>>(&bytes).is_err());
    }
}
