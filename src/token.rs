//! The token that names one request instance.

use std::fmt;
use std::str::FromStr;

/// One request instance in one region: the region's ID, a slot and the
/// slot's generation when the request began.
///
/// A token is 16 bytes and `Copy`. It travels inside an existing dispatch
/// message in one of three stable forms: text ([`Display`](fmt::Display) /
/// [`FromStr`], also its serde form), a `u128`, or 16 little-endian bytes.
///
/// ```
/// use edgemark::Token;
/// let t: Token = "em1.00000000000000ab.2a.7".parse().unwrap();
/// assert_eq!(t.to_string(), "em1.00000000000000ab.2a.7");
/// assert_eq!(Token::from_u128(t.to_u128()), t);
/// assert_eq!(Token::from_bytes(t.to_bytes()), t);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Token {
    pub(crate) region: u64,
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

const _: () = assert!(std::mem::size_of::<Token>() <= 16);

impl Token {
    /// The token as an integer: region in the high 64 bits, then slot, then
    /// generation.
    pub const fn to_u128(self) -> u128 {
        ((self.region as u128) << 64) | ((self.slot as u128) << 32) | self.generation as u128
    }

    /// The token an integer from [`Token::to_u128`] stands for.
    pub const fn from_u128(v: u128) -> Token {
        Token {
            region: (v >> 64) as u64,
            slot: (v >> 32) as u32,
            generation: v as u32,
        }
    }

    /// The token as 16 little-endian bytes (the bytes of [`Token::to_u128`]).
    pub const fn to_bytes(self) -> [u8; 16] {
        self.to_u128().to_le_bytes()
    }

    /// The token 16 bytes from [`Token::to_bytes`] stand for.
    pub const fn from_bytes(b: [u8; 16]) -> Token {
        Token::from_u128(u128::from_le_bytes(b))
    }

    /// The slot index.
    pub const fn slot(self) -> u32 {
        self.slot
    }

    /// The slot's generation when the request began (never 0 for a real
    /// token).
    pub const fn generation(self) -> u32 {
        self.generation
    }

    /// The ID of the region the token belongs to.
    pub const fn region_id(self) -> RegionId {
        RegionId(self.region)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "em1.{}.{:x}.{:x}",
            RegionId(self.region),
            self.slot,
            self.generation
        )
    }
}

/// A region's ID: 64 random bits drawn at creation, in its header and in
/// every token of its requests, so that a token of another region (or of
/// a file created again at the same path) is told apart.
///
/// Its text form, wherever edgemark shows one (a token's second field,
/// `inspect`, Python's `info()["region_id"]`, the JSON of a
/// [`RegionReport`](crate::report::RegionReport)), is 16 lowercase hex
/// digits; [`FromStr`] takes 1 to 16 hex digits of either case.
///
/// ```
/// use edgemark::RegionId;
/// let id: RegionId = "00000000000000ab".parse().unwrap();
/// assert_eq!(id.get(), 0xab);
/// assert_eq!(id.to_string(), "00000000000000ab");
/// assert_eq!("AB".parse::<RegionId>(), Ok(id));
/// assert!("0x1".parse::<RegionId>().is_err());
/// assert!("".parse::<RegionId>().is_err());
/// assert!("1".repeat(17).parse::<RegionId>().is_err());
/// assert_eq!(format!("{id:016x}"), id.to_string());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(u64);

impl RegionId {
    /// The ID of these 64 bits.
    pub const fn new(bits: u64) -> RegionId {
        RegionId(bits)
    }

    /// The ID's 64 bits.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for RegionId {
    fn from(bits: u64) -> RegionId {
        RegionId(bits)
    }
}

impl From<RegionId> for u64 {
    fn from(id: RegionId) -> u64 {
        id.0
    }
}

impl From<RegionId> for u128 {
    fn from(id: RegionId) -> u128 {
        u128::from(id.0)
    }
}

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The ID's bits in hex, as `u64`'s (`{:016x}` is its [`Display`](fmt::Display) form).
impl fmt::LowerHex for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A string that is not a region ID's text form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseRegionIdError(());

impl fmt::Display for ParseRegionIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a region ID (expected 1 to 16 hex digits)")
    }
}

impl std::error::Error for ParseRegionIdError {}

impl FromStr for RegionId {
    type Err = ParseRegionIdError;

    fn from_str(s: &str) -> Result<RegionId, ParseRegionIdError> {
        hex_field(s, 16).map(RegionId).ok_or(ParseRegionIdError(()))
    }
}

/// `s` as 1 to `max_len` hex digits (no sign, no prefix).
fn hex_field(s: &str, max_len: usize) -> Option<u64> {
    if s.is_empty() || s.len() > max_len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

impl serde::Serialize for RegionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for RegionId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RegionId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A string that is not a token's text form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseTokenError(());

impl fmt::Display for ParseTokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not an edgemark token (expected em1.<region hex>.<slot hex>.<generation hex>)")
    }
}

impl std::error::Error for ParseTokenError {}

impl FromStr for Token {
    type Err = ParseTokenError;

    fn from_str(s: &str) -> Result<Token, ParseTokenError> {
        let err = || ParseTokenError(());
        let mut parts = s.split('.');
        if parts.next() != Some("em1") {
            return Err(err());
        }
        let mut field = |max_len: usize| {
            let p = parts.next().ok_or_else(err)?;
            hex_field(p, max_len).ok_or_else(err)
        };
        let region = field(16)?;
        let slot = field(8)? as u32;
        let generation = field(8)? as u32;
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(Token {
            region,
            slot,
            generation,
        })
    }
}

impl serde::Serialize for Token {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Token {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Token, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
