//! A zero-copy msgpack cursor over one payload, on top of `rmp`'s marker table.
//!
//! The decoder needs to branch on a value's type before reading it (a hash is an int *or* a
//! byte string, a field is a value *or* nil) and to skip values it does not know without
//! building them, so it walks markers itself instead of going through a generic `Value`.

use rmp::Marker;

use super::error::DecodeError;

/// Nesting accepted when skipping or keeping unknown values.
pub(crate) const MAX_DEPTH: usize = 64;

/// A msgpack integer, either signed or unsigned as encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Int {
    /// Encoded as a positive fixint or an unsigned format (or a non-negative signed one).
    U(u64),
    /// A negative value.
    I(i64),
}

impl Int {
    /// The value if it fits `i64`.
    pub(crate) fn as_i64(self) -> Option<i64> {
        match self {
            Int::U(v) => i64::try_from(v).ok(),
            Int::I(v) => Some(v),
        }
    }

    /// The value if it is non-negative.
    pub(crate) fn as_u64(self) -> Option<u64> {
        match self {
            Int::U(v) => Some(v),
            Int::I(_) => None,
        }
    }
}

/// The coarse type of the next value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
}

/// A cursor over a msgpack buffer.
#[derive(Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.buf.len())
            .ok_or(DecodeError::Truncated { offset: self.pos })?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn peek_marker(&self) -> Result<Marker, DecodeError> {
        let byte = *self
            .buf
            .get(self.pos)
            .ok_or(DecodeError::Truncated { offset: self.pos })?;
        match Marker::from_u8(byte) {
            Marker::Reserved => Err(DecodeError::InvalidMarker { offset: self.pos }),
            m => Ok(m),
        }
    }

    fn marker(&mut self) -> Result<Marker, DecodeError> {
        let m = self.peek_marker()?;
        self.pos += 1;
        Ok(m)
    }

    /// The type of the next value, without consuming it.
    pub(crate) fn peek_kind(&self) -> Result<Kind, DecodeError> {
        Ok(match self.peek_marker()? {
            Marker::Null => Kind::Nil,
            Marker::True | Marker::False => Kind::Bool,
            Marker::FixPos(_)
            | Marker::FixNeg(_)
            | Marker::U8
            | Marker::U16
            | Marker::U32
            | Marker::U64
            | Marker::I8
            | Marker::I16
            | Marker::I32
            | Marker::I64 => Kind::Int,
            Marker::F32 | Marker::F64 => Kind::Float,
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => Kind::Str,
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => Kind::Bin,
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => Kind::Array,
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => Kind::Map,
            _ => Kind::Ext,
        })
    }

    /// Consumes a nil if one is next; tells whether it did.
    pub(crate) fn eat_nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek_kind()? == Kind::Nil {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Reads an integer; the caller has checked [`Kind::Int`].
    pub(crate) fn read_int(&mut self) -> Result<Int, DecodeError> {
        let v = match self.marker()? {
            Marker::FixPos(v) => Int::U(u64::from(v)),
            Marker::FixNeg(v) => Int::I(i64::from(v)),
            Marker::U8 => Int::U(u64::from(self.be::<1>()?[0])),
            Marker::U16 => Int::U(u64::from(u16::from_be_bytes(self.be()?))),
            Marker::U32 => Int::U(u64::from(u32::from_be_bytes(self.be()?))),
            Marker::U64 => Int::U(u64::from_be_bytes(self.be()?)),
            Marker::I8 => signed(i64::from(self.be::<1>()?[0] as i8)),
            Marker::I16 => signed(i64::from(i16::from_be_bytes(self.be()?))),
            Marker::I32 => signed(i64::from(i32::from_be_bytes(self.be()?))),
            Marker::I64 => signed(i64::from_be_bytes(self.be()?)),
            _ => {
                return Err(DecodeError::InvalidMarker {
                    offset: self.pos - 1,
                })
            }
        };
        Ok(v)
    }

    /// Fast path for token ids: reads an unsigned integer encoded as a positive fixint,
    /// u8, u16 or u32 and returns it; returns `None` and consumes nothing for any other
    /// value or a short buffer, which the caller then reads the general way.
    #[inline]
    pub(crate) fn try_read_small_uint(&mut self) -> Option<u32> {
        let buf = self.buf.get(self.pos..)?;
        let (value, len) = match *buf.first()? {
            b @ 0x00..=0x7f => (u32::from(b), 1),
            0xcc => (u32::from(*buf.get(1)?), 2),
            0xcd => {
                let b = buf.get(1..3)?;
                (u32::from(u16::from_be_bytes([b[0], b[1]])), 3)
            }
            0xce => {
                let b = buf.get(1..5)?;
                (u32::from_be_bytes([b[0], b[1], b[2], b[3]]), 5)
            }
            _ => return None,
        };
        self.pos += len;
        Some(value)
    }

    /// Reads a float or an integer as `f64`; `None` (value consumed) for other types.
    pub(crate) fn read_number(&mut self) -> Result<Option<f64>, DecodeError> {
        match self.peek_marker()? {
            Marker::F32 => {
                self.pos += 1;
                Ok(Some(f64::from(f32::from_be_bytes(self.be()?))))
            }
            Marker::F64 => {
                self.pos += 1;
                Ok(Some(f64::from_be_bytes(self.be()?)))
            }
            _ if self.peek_kind()? == Kind::Int => Ok(Some(match self.read_int()? {
                Int::U(v) => v as f64,
                Int::I(v) => v as f64,
            })),
            _ => {
                self.skip()?;
                Ok(None)
            }
        }
    }

    fn len_after(&mut self, marker: Marker) -> Result<usize, DecodeError> {
        Ok(match marker {
            Marker::FixStr(n) | Marker::FixArray(n) | Marker::FixMap(n) => usize::from(n),
            Marker::Str8 | Marker::Bin8 => usize::from(self.be::<1>()?[0]),
            Marker::Str16 | Marker::Bin16 | Marker::Array16 | Marker::Map16 => {
                usize::from(u16::from_be_bytes(self.be()?))
            }
            Marker::Str32 | Marker::Bin32 | Marker::Array32 | Marker::Map32 => {
                u32::from_be_bytes(self.be()?) as usize
            }
            _ => {
                return Err(DecodeError::InvalidMarker {
                    offset: self.pos - 1,
                })
            }
        })
    }

    /// Reads raw string bytes; the caller has checked [`Kind::Str`].
    pub(crate) fn read_str_bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let m = self.marker()?;
        let n = self.len_after(m)?;
        self.take(n)
    }

    /// Reads a string; `None` when it is not valid UTF-8 (the value is consumed either way).
    pub(crate) fn read_str(&mut self) -> Result<Option<&'a str>, DecodeError> {
        Ok(std::str::from_utf8(self.read_str_bytes()?).ok())
    }

    /// Reads a byte string; the caller has checked [`Kind::Bin`].
    pub(crate) fn read_bin(&mut self) -> Result<&'a [u8], DecodeError> {
        let m = self.marker()?;
        let n = self.len_after(m)?;
        self.take(n)
    }

    /// Reads an array header; the caller has checked [`Kind::Array`].
    pub(crate) fn read_array_len(&mut self) -> Result<usize, DecodeError> {
        let m = self.marker()?;
        self.len_after(m)
    }

    /// Reads a map header (pairs); the caller has checked [`Kind::Map`].
    pub(crate) fn read_map_len(&mut self) -> Result<usize, DecodeError> {
        let m = self.marker()?;
        self.len_after(m)
    }

    /// Skips `n` values.
    pub(crate) fn skip_n(&mut self, n: usize) -> Result<(), DecodeError> {
        for _ in 0..n {
            self.skip()?;
        }
        Ok(())
    }

    /// Skips one whole value without recursion; fails past [`MAX_DEPTH`] levels of nesting.
    pub(crate) fn skip(&mut self) -> Result<(), DecodeError> {
        // Items still to read at each open container level.
        let mut stack = [0u64; MAX_DEPTH];
        let mut depth = 0usize;
        let mut pending: u64 = 1;
        loop {
            while pending == 0 {
                if depth == 0 {
                    return Ok(());
                }
                depth -= 1;
                pending = stack[depth];
            }
            pending -= 1;
            let m = self.marker()?;
            let children: u64 = match m {
                Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                    self.len_after(m)? as u64
                }
                Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => 2 * self.len_after(m)? as u64,
                Marker::FixStr(_)
                | Marker::Str8
                | Marker::Str16
                | Marker::Str32
                | Marker::Bin8
                | Marker::Bin16
                | Marker::Bin32 => {
                    let n = self.len_after(m)?;
                    self.take(n)?;
                    0
                }
                Marker::U8 | Marker::I8 => self.take(1).map(|_| 0)?,
                Marker::U16 | Marker::I16 => self.take(2).map(|_| 0)?,
                Marker::U32 | Marker::I32 | Marker::F32 => self.take(4).map(|_| 0)?,
                Marker::U64 | Marker::I64 | Marker::F64 => self.take(8).map(|_| 0)?,
                Marker::FixExt1 => self.take(2).map(|_| 0)?,
                Marker::FixExt2 => self.take(3).map(|_| 0)?,
                Marker::FixExt4 => self.take(5).map(|_| 0)?,
                Marker::FixExt8 => self.take(9).map(|_| 0)?,
                Marker::FixExt16 => self.take(17).map(|_| 0)?,
                Marker::Ext8 => {
                    let n = usize::from(self.be::<1>()?[0]);
                    self.take(n + 1).map(|_| 0)?
                }
                Marker::Ext16 => {
                    let n = usize::from(u16::from_be_bytes(self.be()?));
                    self.take(n + 1).map(|_| 0)?
                }
                Marker::Ext32 => {
                    let n = u32::from_be_bytes(self.be()?) as usize;
                    self.take(n.saturating_add(1)).map(|_| 0)?
                }
                _ => 0,
            };
            if children > 0 {
                if depth == MAX_DEPTH {
                    return Err(DecodeError::TooDeep { limit: MAX_DEPTH });
                }
                stack[depth] = pending;
                depth += 1;
                pending = children;
            }
        }
    }

    /// Reads one whole value as an owned [`rmpv::Value`] (for display-only fields).
    pub(crate) fn read_value(&mut self) -> Result<rmpv::Value, DecodeError> {
        let start = self.pos;
        // Skipping first bounds the nesting before rmpv recurses over it.
        self.skip()?;
        let mut slice = &self.buf[start..self.pos];
        rmpv::decode::read_value(&mut slice).map_err(|_| DecodeError::Truncated { offset: start })
    }
}

fn signed(v: i64) -> Int {
    if v < 0 {
        Int::I(v)
    } else {
        Int::U(v as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_walks_nested_values() {
        let value = rmpv::Value::Array(vec![
            rmpv::Value::from(1),
            rmpv::Value::Map(vec![(
                rmpv::Value::from("k"),
                rmpv::Value::from(vec![1u8, 2]),
            )]),
            rmpv::Value::from("tail"),
        ]);
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, &value).unwrap();
        buf.push(0x07);
        let mut r = Reader::new(&buf);
        r.skip().unwrap();
        assert_eq!(r.remaining(), 1);
    }

    #[test]
    fn skip_rejects_deep_nesting_without_recursion() {
        let buf = vec![0x91u8; 10_000];
        let mut r = Reader::new(&buf);
        assert_eq!(r.skip(), Err(DecodeError::TooDeep { limit: MAX_DEPTH }));
    }

    #[test]
    fn truncated_lengths_are_errors_not_panics() {
        let buf = [0xdb, 0xff, 0xff, 0xff, 0xff];
        let mut r = Reader::new(&buf);
        assert!(matches!(r.skip(), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn signed_formats_with_positive_values_read_as_unsigned() {
        let buf = [0xd3, 0, 0, 0, 0, 0, 0, 0, 5];
        assert_eq!(Reader::new(&buf).read_int().unwrap(), Int::U(5));
        let buf = [0xd0, 0xff];
        assert_eq!(Reader::new(&buf).read_int().unwrap(), Int::I(-1));
    }
}
