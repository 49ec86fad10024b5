//! Order ids against the shop's id column: which texts can be a value of
//! it, how the column spells them (the canonical form), and the typed value
//! bound for them, so that an id is always compared exactly, in the
//! column's own type.
//!
//! An id that cannot be a value of the column (too long for `varchar(8)`,
//! out of range for `integer`, not a uuid, …) is rejected here with the
//! reason ([`IdRejected`]) and never reaches a statement: a cast would
//! truncate it into another order's id, or fail the whole batch.

use super::StoreError;
use super::catalog::Column;
use crate::message::OrderId;

/// Why an order id cannot be a value of the shop's id column: such an id
/// matches no row, and the message naming it is an unknown order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdRejected {
    /// Longer than a character column holds.
    #[error("{chars} characters, column {column} holds at most {max}")]
    TooLong {
        /// The id's length in characters.
        chars: usize,
        /// The column's type.
        column: String,
        /// The column's length.
        max: u64,
    },
    /// Ends with a space, which a fixed-length `char(n)` column pads and
    /// strips: no row can hold it exactly.
    #[error("ends with a space, which column {column} does not keep")]
    TrailingSpace {
        /// The column's type.
        column: String,
    },
    /// Not a whole number, for an integer or decimal column.
    #[error("not an integer (column {column})")]
    NotAnInteger {
        /// The column's type.
        column: String,
    },
    /// A whole number outside the integer column's range.
    #[error("{value} is out of range for {column}")]
    OutOfRange {
        /// The id.
        value: String,
        /// The column's type.
        column: String,
    },
    /// More digits than a decimal column holds.
    #[error("{digits} digits, column {column} holds at most {max}")]
    TooManyDigits {
        /// The id's digits (without leading zeros).
        digits: usize,
        /// The column's type.
        column: String,
        /// The column's precision.
        max: u32,
    },
    /// Not a uuid, for a uuid column.
    #[error("not a uuid")]
    NotAUuid,
}

/// The shop's order id column as the store compares ids with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IdColumn {
    /// The column's type as the database shows it (`character varying(8)`,
    /// `bigint(20) unsigned`), for the reasons.
    shown: String,
    kind: IdType,
}

/// What values the column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IdType {
    /// Characters, as they are: at most `max_chars` of them (`None`: no
    /// limit an order id could reach); `pads`: a fixed-length `char(n)`
    /// column, whose trailing spaces are padding.
    Text { max_chars: Option<u64>, pads: bool },
    /// Whole numbers in `min..=max`.
    Integer { min: i128, max: i128 },
    /// Whole numbers of at most `digits` digits (`None`: unconstrained).
    Decimal { digits: Option<u32>, unsigned: bool },
    /// Uuids: canonical in lower case with hyphens.
    Uuid,
}

/// An order id as a value of the id column's own type, for binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum IdValue {
    /// A character column's value.
    Text(String),
    /// `smallint` and narrower.
    I16(i16),
    /// `integer`, `mediumint`.
    I32(i32),
    /// `bigint`, `int unsigned`.
    I64(i64),
    /// `bigint unsigned` (MySQL).
    U64(u64),
    /// A decimal column's whole number, in decimal digits (an optional
    /// leading `-`, no leading zeros).
    Decimal(String),
    /// A uuid's 16 bytes.
    Uuid([u8; 16]),
}

impl IdValue {
    /// The id as text, as PostgreSQL is sent it (and casts it to the
    /// column's type).
    pub(crate) fn text(&self) -> String {
        match self {
            Self::Text(s) | Self::Decimal(s) => s.clone(),
            Self::I16(n) => n.to_string(),
            Self::I32(n) => n.to_string(),
            Self::I64(n) => n.to_string(),
            Self::U64(n) => n.to_string(),
            Self::Uuid(bytes) => uuid_text(bytes),
        }
    }
}

impl IdColumn {
    /// The id column `column` of the mapping key `key` (`[orders].id`,
    /// `[items].order_id`). A decimal column with fraction digits cannot
    /// hold order ids exactly and is refused.
    pub(crate) fn of(key: &'static str, column: &Column) -> Result<Self, StoreError> {
        let shown = column.shown.clone();
        let kind = match column.type_name.to_ascii_lowercase().as_str() {
            "uuid" => IdType::Uuid,
            "numeric" | "decimal" => {
                if column.scale.is_some_and(|s| s > 0) {
                    return Err(StoreError::Schema {
                        key,
                        problem: format!(
                            "the id column's type {shown} has fraction digits: order ids \
                             are whole numbers or text"
                        ),
                    });
                }
                IdType::Decimal {
                    digits: column.precision.and_then(|p| u32::try_from(p).ok()),
                    unsigned: column.unsigned,
                }
            }
            name => match integer_bits(name) {
                Some(bits) => integer_range(bits, column.unsigned),
                None => IdType::Text {
                    max_chars: column.max_chars.and_then(|n| u64::try_from(n).ok()),
                    pads: matches!(name, "bpchar" | "char" | "character"),
                },
            },
        };
        Ok(Self { shown, kind })
    }

    /// A statement parameter of the PostgreSQL base type `type_name`
    /// (`pg_type.typname`: `int4`, `numeric`, `text`, …) as a column the
    /// order id is bound to: [`IdColumn::value`] then gives the id in
    /// exactly that type, or why it cannot be one (`abc` for `int8`).
    /// `None`: a type no order id is bound as (a date, `bytea`, …).
    pub(crate) fn of_parameter(type_name: &str) -> Option<Self> {
        let kind = match type_name {
            "uuid" => IdType::Uuid,
            "numeric" => IdType::Decimal {
                digits: None,
                unsigned: false,
            },
            "text" | "varchar" | "bpchar" | "name" | "citext" | "unknown" => IdType::Text {
                max_chars: None,
                pads: false,
            },
            name => integer_range(integer_bits(name).filter(|b| *b >= 16)?, false),
        };
        Some(Self {
            shown: type_name.to_owned(),
            kind,
        })
    }

    /// The kind shown in the schema report.
    pub(crate) fn kind(&self) -> super::IdKind {
        match self.kind {
            IdType::Text { .. } => super::IdKind::Text,
            IdType::Integer { .. } | IdType::Decimal { .. } => super::IdKind::Integer,
            IdType::Uuid => super::IdKind::Uuid,
        }
    }

    /// `id` as the column spells it (`00123` is `123` in an integer column,
    /// uuids in lower case with hyphens, text as it is), or why no row can
    /// have it.
    pub(crate) fn canonical(&self, id: &OrderId) -> Result<OrderId, IdRejected> {
        let text = match self.kind {
            IdType::Text { max_chars, pads } => {
                return self
                    .check_text(id.as_str(), max_chars, pads)
                    .map(|()| id.clone());
            }
            IdType::Integer { min, max } => self.integer(id.as_str(), min, max)?.to_string(),
            IdType::Decimal { digits, unsigned } => self.decimal(id.as_str(), digits, unsigned)?,
            IdType::Uuid => uuid_text(&uuid_bytes(id.as_str())?),
        };
        // A canonical form is never longer than the id it came from.
        OrderId::parse(&text).map_err(|_| IdRejected::NotAnInteger {
            column: self.shown.clone(),
        })
    }

    /// `id` as a value of the column's own type, or why no row can have it.
    pub(crate) fn value(&self, id: &str) -> Result<IdValue, IdRejected> {
        Ok(match self.kind {
            IdType::Text { max_chars, pads } => {
                self.check_text(id, max_chars, pads)?;
                IdValue::Text(id.to_owned())
            }
            IdType::Integer { min, max } => {
                let n = self.integer(id, min, max)?;
                // The narrowest binding type holding the column's range.
                let fits = |lo: i128, hi: i128| lo <= min && max <= hi;
                match () {
                    () if fits(i16::MIN.into(), i16::MAX.into()) => IdValue::I16(n as i16),
                    () if fits(i32::MIN.into(), i32::MAX.into()) => IdValue::I32(n as i32),
                    () if fits(i64::MIN.into(), i64::MAX.into()) => IdValue::I64(n as i64),
                    () => IdValue::U64(n as u64),
                }
            }
            IdType::Decimal { digits, unsigned } => {
                IdValue::Decimal(self.decimal(id, digits, unsigned)?)
            }
            IdType::Uuid => IdValue::Uuid(uuid_bytes(id)?),
        })
    }

    fn check_text(&self, id: &str, max_chars: Option<u64>, pads: bool) -> Result<(), IdRejected> {
        let chars = id.chars().count();
        if let Some(max) = max_chars.filter(|max| chars as u64 > *max) {
            return Err(IdRejected::TooLong {
                chars,
                column: self.shown.clone(),
                max,
            });
        }
        if pads && id.ends_with(' ') {
            return Err(IdRejected::TrailingSpace {
                column: self.shown.clone(),
            });
        }
        Ok(())
    }

    fn integer(&self, id: &str, min: i128, max: i128) -> Result<i128, IdRejected> {
        let (negative, digits) = whole_number(id).ok_or_else(|| IdRejected::NotAnInteger {
            column: self.shown.clone(),
        })?;
        let out_of_range = || IdRejected::OutOfRange {
            value: id.to_owned(),
            column: self.shown.clone(),
        };
        // Too large for an i128 is out of any integer column's range.
        let magnitude: i128 = digits.parse().map_err(|_| out_of_range())?;
        let n = if negative { -magnitude } else { magnitude };
        if n < min || n > max {
            return Err(out_of_range());
        }
        Ok(n)
    }

    fn decimal(&self, id: &str, digits: Option<u32>, unsigned: bool) -> Result<String, IdRejected> {
        let (negative, number) = whole_number(id).ok_or_else(|| IdRejected::NotAnInteger {
            column: self.shown.clone(),
        })?;
        if let Some(max) = digits.filter(|max| number.len() > *max as usize) {
            return Err(IdRejected::TooManyDigits {
                digits: number.len(),
                column: self.shown.clone(),
                max,
            });
        }
        if negative && unsigned {
            return Err(IdRejected::OutOfRange {
                value: id.to_owned(),
                column: self.shown.clone(),
            });
        }
        Ok(if negative {
            format!("-{number}")
        } else {
            number.to_owned()
        })
    }
}

/// The bits of an integer type name (PostgreSQL's `pg_type.typname`,
/// MySQL's `data_type`).
fn integer_bits(type_name: &str) -> Option<u32> {
    match type_name {
        "tinyint" => Some(8),
        "int2" | "smallint" => Some(16),
        "mediumint" => Some(24),
        "int4" | "integer" | "int" => Some(32),
        "int8" | "bigint" => Some(64),
        _ => None,
    }
}

fn integer_range(bits: u32, unsigned: bool) -> IdType {
    if unsigned {
        IdType::Integer {
            min: 0,
            max: (1i128 << bits) - 1,
        }
    } else {
        IdType::Integer {
            min: -(1i128 << (bits - 1)),
            max: (1i128 << (bits - 1)) - 1,
        }
    }
}

/// A whole number's sign and digits without leading zeros (`-0` is `0`):
/// an optional `+` or `-`, then ASCII digits.
fn whole_number(id: &str) -> Option<(bool, &str)> {
    let (negative, digits) = match id.as_bytes().first()? {
        b'-' => (true, &id[1..]),
        b'+' => (false, &id[1..]),
        _ => (false, id),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let trimmed = digits.trim_start_matches('0');
    Some(match trimmed {
        "" => (false, "0"),
        digits => (negative, digits),
    })
}

/// A uuid's bytes: 32 hex digits, with or without hyphens, any case.
fn uuid_bytes(id: &str) -> Result<[u8; 16], IdRejected> {
    let hex: Vec<u8> = id.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return Err(IdRejected::NotAUuid);
    }
    let mut bytes = [0u8; 16];
    for (byte, pair) in bytes.iter_mut().zip(hex.chunks(2)) {
        let digit = |b: u8| (b as char).to_digit(16).ok_or(IdRejected::NotAUuid);
        *byte = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Ok(bytes)
}

/// A uuid's canonical text: lower case, hyphenated 8-4-4-4-12.
pub(crate) fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn id(s: &str) -> OrderId {
        OrderId::parse(s).unwrap()
    }

    fn column(shown: &str, type_name: &str) -> Column {
        Column {
            shown: shown.into(),
            type_name: type_name.into(),
            ..Column::default()
        }
    }

    fn varchar(n: i64) -> IdColumn {
        let c = Column {
            max_chars: Some(n),
            ..column(&format!("character varying({n})"), "varchar")
        };
        IdColumn::of("k", &c).unwrap()
    }

    fn char_n(n: i64) -> IdColumn {
        let c = Column {
            max_chars: Some(n),
            ..column(&format!("character({n})"), "bpchar")
        };
        IdColumn::of("k", &c).unwrap()
    }

    fn int(type_name: &str, unsigned: bool) -> IdColumn {
        let c = Column {
            unsigned,
            ..column(type_name, type_name)
        };
        IdColumn::of("k", &c).unwrap()
    }

    fn decimal(precision: Option<i64>) -> IdColumn {
        let c = Column {
            precision,
            scale: precision.map(|_| 0),
            ..column("numeric", "numeric")
        };
        IdColumn::of("k", &c).unwrap()
    }

    fn text() -> IdColumn {
        IdColumn::of("k", &column("text", "text")).unwrap()
    }

    fn uuid() -> IdColumn {
        IdColumn::of("k", &column("uuid", "uuid")).unwrap()
    }

    #[test]
    fn ids_are_canonical_for_their_column() {
        let integer = int("int8", false);
        assert_eq!(integer.canonical(&id("00123")), Ok(id("123")));
        assert!(integer.canonical(&id("abc")).is_err());
        assert!(integer.canonical(&id("99999999999999999999")).is_err());
        assert_eq!(text().canonical(&id("00123")), Ok(id("00123")));
        assert_eq!(
            uuid().canonical(&id("A1B2C3D4E5F60718293A4B5C6D7E8F90")),
            Ok(id("a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90"))
        );
        assert_eq!(
            uuid().canonical(&id("not-a-uuid")),
            Err(IdRejected::NotAUuid)
        );
    }

    #[test]
    fn rejections_say_why() {
        let reason = |c: &IdColumn, s: &str| c.canonical(&id(s)).unwrap_err().to_string();
        assert_eq!(
            reason(&varchar(8), "ORD00001-not-this-order"),
            "23 characters, column character varying(8) holds at most 8"
        );
        assert_eq!(
            reason(&int("integer", false), "3000000000"),
            "3000000000 is out of range for integer"
        );
        assert_eq!(reason(&uuid(), "ORD1"), "not a uuid");
        assert_eq!(
            reason(&char_n(8), "abc "),
            "ends with a space, which column character(8) does not keep"
        );
        assert_eq!(
            reason(&decimal(Some(5)), "123456"),
            "6 digits, column numeric holds at most 5"
        );
        assert!(reason(&int("bigint", true), "-1").contains("out of range"));
    }

    #[test]
    fn fraction_digits_are_refused_at_prepare() {
        let c = Column {
            precision: Some(10),
            scale: Some(2),
            ..column("decimal(10,2)", "decimal")
        };
        let err = IdColumn::of("[orders].id", &c).unwrap_err();
        assert!(err.is_config(), "{err}");
        assert!(err.to_string().contains("[orders].id"), "{err}");
    }

    #[test]
    fn integer_ranges_follow_the_type() {
        let cases: [(&str, bool, i128, i128); 9] = [
            ("tinyint", false, -128, 127),
            ("tinyint", true, 0, 255),
            ("int2", false, -32768, 32767),
            ("mediumint", true, 0, 16_777_215),
            ("int4", false, i32::MIN.into(), i32::MAX.into()),
            ("int", true, 0, u32::MAX.into()),
            ("int8", false, i64::MIN.into(), i64::MAX.into()),
            ("bigint", false, i64::MIN.into(), i64::MAX.into()),
            ("bigint", true, 0, u64::MAX.into()),
        ];
        for (name, unsigned, min, max) in cases {
            let c = int(name, unsigned);
            for ok in [min, max, (min + max) / 2] {
                assert_eq!(c.canonical(&id(&ok.to_string())), Ok(id(&ok.to_string())));
            }
            for bad in [min - 1, max + 1] {
                let err = c.canonical(&id(&bad.to_string())).unwrap_err();
                assert!(
                    matches!(err, IdRejected::OutOfRange { .. }),
                    "{name}: {err}"
                );
            }
        }
    }

    #[test]
    fn values_are_bound_in_the_narrowest_type_holding_the_column() {
        assert_eq!(int("int2", false).value("7"), Ok(IdValue::I16(7)));
        assert_eq!(int("tinyint", true).value("255"), Ok(IdValue::I16(255)));
        assert_eq!(int("int4", false).value("-7"), Ok(IdValue::I32(-7)));
        assert_eq!(
            int("int", true).value("4294967295"),
            Ok(IdValue::I64(4_294_967_295))
        );
        assert_eq!(int("int8", false).value("007"), Ok(IdValue::I64(7)));
        assert_eq!(
            int("bigint", true).value("18446744073709551615"),
            Ok(IdValue::U64(u64::MAX))
        );
        assert_eq!(
            decimal(Some(30)).value("000123456789012345678901234567"),
            Ok(IdValue::Decimal("123456789012345678901234567".into()))
        );
        assert_eq!(
            uuid().value("A1B2C3D4-E5F6-0718-293A-4B5C6D7E8F90"),
            Ok(IdValue::Uuid([
                0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6, 0x07, 0x18, 0x29, 0x3a, 0x4b, 0x5c, 0x6d, 0x7e,
                0x8f, 0x90
            ]))
        );
        assert_eq!(varchar(3).value("abc"), Ok(IdValue::Text("abc".into())));
        assert!(varchar(3).value("abcd").is_err());
    }

    /// Any order id: printable text up to the message limit.
    fn any_id() -> impl Strategy<Value = OrderId> {
        "[ -~\u{a0}-\u{17f}]{1,40}".prop_filter_map("an order id", |s| OrderId::parse(&s).ok())
    }

    proptest! {
        /// Canonical forms are fixed points, and the bound value is the
        /// canonical form's: `canonical` never changes which row an id means.
        #[test]
        fn canonical_forms_are_stable(raw in any_id(), which in 0usize..6) {
            let columns = [
                varchar(8), char_n(8), text(), int("int4", false),
                decimal(Some(20)), uuid(),
            ];
            let c = &columns[which];
            if let Ok(canonical) = c.canonical(&raw) {
                prop_assert_eq!(c.canonical(&canonical), Ok(canonical.clone()));
                prop_assert_eq!(c.value(raw.as_str()), c.value(canonical.as_str()));
            }
        }

        /// A character column keeps ids as they are, exactly: accepted iff
        /// it holds that many characters (and, for `char(n)`, no trailing
        /// space), never shortened.
        #[test]
        fn text_ids_are_kept_or_rejected_never_cut(raw in any_id(), n in 1i64..24) {
            let chars = raw.as_str().chars().count() as i64;
            match varchar(n).canonical(&raw) {
                Ok(kept) => { prop_assert_eq!(&kept, &raw); prop_assert!(chars <= n); }
                Err(IdRejected::TooLong { chars: c, max, .. }) => {
                    prop_assert!(chars > n);
                    prop_assert_eq!((c as i64, max as i64), (chars, n));
                }
                Err(other) => prop_assert!(false, "{other}"),
            }
            let padded = char_n(n).canonical(&raw);
            prop_assert_eq!(
                padded.is_ok(),
                chars <= n && !raw.as_str().ends_with(' ')
            );
        }

        /// Integers: every number in the column's range is accepted in any
        /// spelling (leading zeros, `+`) as its decimal form; every number
        /// outside it is rejected as out of range, whatever its size.
        #[test]
        fn integers_are_accepted_iff_in_range(
            n in any::<i128>(),
            zeros in 0usize..4,
            plus in any::<bool>(),
            which in 0usize..6,
        ) {
            let (name, unsigned) = [
                ("int2", false), ("int4", false), ("int8", false),
                ("tinyint", true), ("int", true), ("bigint", true),
            ][which];
            let c = int(name, unsigned);
            let IdType::Integer { min, max } = c.kind else { unreachable!() };
            let digits = format!("{}{}", "0".repeat(zeros), n.unsigned_abs());
            let sign = if n < 0 { "-" } else if plus { "+" } else { "" };
            let spelled = id(&format!("{sign}{digits}"));
            match c.canonical(&spelled) {
                Ok(canonical) => {
                    prop_assert!(min <= n && n <= max);
                    prop_assert_eq!(canonical.as_str(), n.to_string());
                }
                Err(IdRejected::OutOfRange { .. }) => prop_assert!(n < min || n > max),
                Err(other) => prop_assert!(false, "{other}"),
            }
        }

        /// Decimal columns: digits beyond the precision are rejected, never
        /// rounded; within it the value is the number without leading zeros.
        #[test]
        fn decimals_keep_every_digit(digits in "[0-9]{1,40}", p in 1i64..40) {
            let c = decimal(Some(p));
            let significant = digits.trim_start_matches('0');
            let significant = if significant.is_empty() { "0" } else { significant };
            match c.canonical(&id(&digits)) {
                Ok(canonical) => {
                    prop_assert!(significant.len() as i64 <= p);
                    prop_assert_eq!(canonical.as_str(), significant);
                }
                Err(IdRejected::TooManyDigits { .. }) => {
                    prop_assert!(significant.len() as i64 > p);
                }
                Err(other) => prop_assert!(false, "{other}"),
            }
        }

        /// Uuids: any spelling of 16 bytes is the lower-case hyphenated form
        /// of the same bytes; anything else is not a uuid.
        #[test]
        fn uuids_are_bytes_in_any_spelling(bytes in any::<[u8; 16]>(), upper in any::<bool>()) {
            let plain: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let plain = if upper { plain.to_uppercase() } else { plain };
            let canonical = uuid().canonical(&id(&plain)).unwrap();
            prop_assert_eq!(canonical.as_str(), uuid_text(&bytes));
            prop_assert_eq!(uuid().value(&plain), Ok(IdValue::Uuid(bytes)));
            prop_assert_eq!(uuid().canonical(&id(&plain[..31])), Err(IdRejected::NotAUuid));
        }

        /// Text that is not a uuid's 32 hex digits is never one.
        #[test]
        fn non_uuids_are_rejected(raw in any_id()) {
            let hex: Vec<u8> = raw.as_str().bytes().filter(|b| *b != b'-').collect();
            let is_uuid = hex.len() == 32 && hex.iter().all(u8::is_ascii_hexdigit);
            prop_assert_eq!(uuid().canonical(&raw).is_ok(), is_uuid);
        }
    }
}
