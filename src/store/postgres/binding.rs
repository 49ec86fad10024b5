//! How an order id is bound to a parameter of the type PostgreSQL
//! inferred for it ([`AlsoParam`], [`BoundId`]), and an id in its column's
//! own type ([`IdValue`]'s encoding).

use sqlx::encode::{Encode, IsNull};
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgTypeKind};
use sqlx::{AssertSqlSafe, Executor, SqlSafeStr};

use super::PgStore;
use crate::store::ids::{IdColumn, IdValue};
use crate::store::sql::AlsoCheckError;

/// `numeric`, `uuid` (no sqlx feature names them here).
pub(super) const NUMERIC: Oid = Oid(1700);
pub(super) const UUID: Oid = Oid(2950);

/// Prepares `statement` on a connection of the pool, returning the types
/// PostgreSQL inferred for its parameters. The statement stays in that
/// connection's statement cache with those types, which is why every
/// value later bound to it must be encoded as them ([`AlsoParam`]).
pub(super) async fn parameter_types(
    store: &PgStore,
    statement: &str,
) -> Result<Vec<PgTypeInfo>, sqlx::Error> {
    let mut conn = store.pool.acquire().await?;
    let prepared = conn
        .prepare(AssertSqlSafe(statement.to_owned()).into_sql_str())
        .await?;
    Ok(sqlx::Statement::parameters(&prepared)
        .and_then(|p| p.left())
        .map(<[PgTypeInfo]>::to_vec)
        .unwrap_or_default())
}

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
    pub(super) fn new(n: usize, ty: PgTypeInfo) -> Result<Self, AlsoCheckError> {
        let name = base_type_name(&ty);
        match IdColumn::of_parameter(&name) {
            Some(base) => Ok(Self { n, ty, base }),
            None => Err(AlsoCheckError::Unbindable(format!(
                "parameter ${n} is of type {name} in this statement: the order id is bound as \
                 text, an integer, numeric or uuid; cast it (${n}::text, ${n}::bigint)"
            ))),
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
/// `numeric` (binary: base-10000 digits), `uuid` (16 bytes) or text.
impl Encode<'_, sqlx::Postgres> for IdValue {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        match self {
            Self::Text(s) => <&str as Encode<sqlx::Postgres>>::encode(s.as_str(), buf),
            Self::I16(n) => <i16 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::I32(n) => <i32 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::I64(n) => <i64 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::U64(n) => {
                buf.extend(numeric(&n.to_string()));
                Ok(IsNull::No)
            }
            Self::Decimal(digits) => {
                buf.extend(numeric(digits));
                Ok(IsNull::No)
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
            Self::U64(_) | Self::Decimal(_) => PgTypeInfo::with_oid(NUMERIC),
            Self::Uuid(_) => PgTypeInfo::with_oid(UUID),
        })
    }
}

/// A whole number (an optional `-`, then digits without leading zeros) in
/// `numeric`'s binary form: digit count, weight, sign, display scale, then
/// base-10000 digits, most significant first.
pub(super) fn numeric(number: &str) -> Vec<u8> {
    let (sign, digits) = match number.strip_prefix('-') {
        Some(digits) => (0x4000u16, digits),
        None => (0x0000u16, number),
    };
    let digits = digits.trim_start_matches('0');
    // Groups of four decimal digits from the right.
    let first = match digits.len() % 4 {
        0 => 4,
        n => n,
    };
    let mut groups: Vec<i16> = Vec::new();
    let mut rest = digits;
    let mut take = first;
    while !rest.is_empty() {
        let (group, tail) = rest.split_at(take);
        groups.push(group.parse().unwrap_or(0));
        rest = tail;
        take = 4;
    }
    let count = groups.len() as i16;
    let mut out = Vec::with_capacity(8 + 2 * groups.len());
    out.extend(count.to_be_bytes());
    out.extend((count - 1).max(0).to_be_bytes());
    out.extend(if groups.is_empty() { 0 } else { sign }.to_be_bytes());
    out.extend(0i16.to_be_bytes());
    for group in groups {
        out.extend(group.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::numeric;

    #[test]
    fn numerics_are_base_10000_digits() {
        let header = |n: i16, weight: i16, sign: u16| {
            let mut h = Vec::new();
            h.extend(n.to_be_bytes());
            h.extend(weight.to_be_bytes());
            h.extend(sign.to_be_bytes());
            h.extend(0i16.to_be_bytes());
            h
        };
        assert_eq!(numeric("0"), header(0, 0, 0));
        let mut seven = header(1, 0, 0);
        seven.extend(7i16.to_be_bytes());
        assert_eq!(numeric("7"), seven);
        let mut big = header(3, 2, 0x4000);
        for g in [12i16, 3456, 7890] {
            big.extend(g.to_be_bytes());
        }
        assert_eq!(numeric("-1234567890"), big);
    }
}
