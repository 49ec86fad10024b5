//! How an order id is bound to a parameter of the type PostgreSQL
//! inferred for it ([`AlsoParam`], [`BoundId`]), and an id in its column's
//! own type ([`IdValue`]'s encoding).

use std::str::FromStr;

use sqlx::encode::{Encode, IsNull};
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgTypeKind};
use sqlx::types::BigDecimal;

use crate::store::ids::{IdColumn, IdValue};

/// `uuid` (no sqlx feature names it here).
const UUID: Oid = Oid(2950);

/// How the order id is bound to one parameter of an `also` statement: as
/// the type PostgreSQL inferred for the parameter when the check prepared
/// the statement (`text` for `$1::text` or a text column, `bigint` where
/// it is compared with a bigint column, the id column's own type, …).
///
/// sqlx keeps a prepared statement in each connection's cache under its
/// text, with the parameter types of its first preparation: on the
/// connection the check prepared it on, the types the server inferred; on
/// the others, the types of the values first bound. An id encoded as
/// another type than the statement's parameter (an `int4` sent to a
/// parameter inferred as `text`) is read as that type's bytes there
/// (`invalid byte sequence for encoding "UTF8": 0x00`), so every
/// connection must be sent the same type: the inferred one.
#[derive(Clone, Debug)]
pub(crate) struct AlsoParam {
    /// `$n`.
    n: usize,
    /// The parameter's type, as PostgreSQL inferred it (a domain's own).
    ty: PgTypeInfo,
    /// The type's base, as a column an id can be a value of.
    base: IdColumn,
}

impl AlsoParam {
    /// Parameter `$n` of type `ty`, if an order id can be bound as it.
    pub(super) fn new(n: usize, ty: PgTypeInfo) -> Result<Self, String> {
        let name = base_type_name(&ty);
        match IdColumn::of_parameter(&name) {
            Some(base) => Ok(Self { n, ty, base }),
            None => Err(format!(
                "parameter ${n} is of type {name} in this statement: the order id is bound as \
                 text, an integer, numeric or uuid; cast it (${n}::text, ${n}::bigint)"
            )),
        }
    }

    /// The order `id` (canonical for the id column) as this parameter's
    /// value, or why it cannot be one (`abc` for a `bigint` parameter).
    pub(super) fn bind(&self, id: &str) -> Result<BoundId<'_>, String> {
        match self.base.value(id) {
            Ok(value) => Ok(BoundId {
                ty: &self.ty,
                value,
            }),
            Err(rejected) => Err(format!(
                "order id {id:?} cannot be bound to ${} of an `also` statement: {rejected}",
                self.n
            )),
        }
    }
}

/// The name of `ty`'s base type (`pg_type.typname`): a domain's base, a
/// built-in type by its oid, another type by its name (`citext`).
pub(super) fn base_type_name(ty: &PgTypeInfo) -> String {
    if let PgTypeKind::Domain(base) = ty.kind() {
        return base_type_name(base);
    }
    let builtin = match ty.oid().map(|oid| oid.0) {
        Some(21) => "int2",
        Some(23) => "int4",
        Some(20) => "int8",
        Some(1700) => "numeric",
        Some(2950) => "uuid",
        Some(25) => "text",
        Some(1043) => "varchar",
        Some(1042) => "bpchar",
        Some(19) => "name",
        Some(705) => "unknown",
        _ => return sqlx::TypeInfo::name(ty).to_ascii_lowercase(),
    };
    builtin.to_owned()
}

/// An order id bound as an [`AlsoParam`]'s type: its value encoded in the
/// parameter's base type, declared as the parameter's own type.
#[derive(Debug)]
pub(crate) struct BoundId<'a> {
    ty: &'a PgTypeInfo,
    value: IdValue,
}

impl sqlx::Type<sqlx::Postgres> for BoundId<'_> {
    fn type_info() -> PgTypeInfo {
        <str as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl Encode<'_, sqlx::Postgres> for BoundId<'_> {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        self.value.encode_by_ref(buf)
    }

    fn produces(&self) -> Option<PgTypeInfo> {
        Some(self.ty.clone())
    }
}

/// Bound as text unless [`Encode::produces`] says otherwise per value.
impl sqlx::Type<sqlx::Postgres> for IdValue {
    fn type_info() -> PgTypeInfo {
        <str as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

/// An order id in the id column's own type: `int2`/`int4`/`int8`,
/// `numeric`, `uuid` (16 bytes) or text.
impl Encode<'_, sqlx::Postgres> for IdValue {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        match self {
            Self::Text(s) => <&str as Encode<sqlx::Postgres>>::encode(s.as_str(), buf),
            Self::I16(n) => <i16 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::I32(n) => <i32 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::I64(n) => <i64 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::U64(_) | Self::Decimal(_) => {
                let decimal = BigDecimal::from_str(&self.text())?;
                <BigDecimal as Encode<sqlx::Postgres>>::encode_by_ref(&decimal, buf)
            }
            Self::Uuid(bytes) => {
                buf.extend_from_slice(bytes);
                Ok(IsNull::No)
            }
        }
    }

    fn produces(&self) -> Option<PgTypeInfo> {
        Some(match self {
            Self::Text(_) => <str as sqlx::Type<sqlx::Postgres>>::type_info(),
            Self::I16(_) => <i16 as sqlx::Type<sqlx::Postgres>>::type_info(),
            Self::I32(_) => <i32 as sqlx::Type<sqlx::Postgres>>::type_info(),
            Self::I64(_) => <i64 as sqlx::Type<sqlx::Postgres>>::type_info(),
            Self::U64(_) | Self::Decimal(_) => {
                <BigDecimal as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            Self::Uuid(_) => PgTypeInfo::with_oid(UUID),
        })
    }
}
