-- Order ids in the outbox compare byte for byte. Under the default collation
-- (case-insensitive, padding with spaces) a shop whose own id column tells
-- `aB1` from `Ab1`, or `abc` from `abc `, would have two orders share one
-- outbox row, and the second cancellation would record no release and no
-- event. VARBINARY keeps every byte and compares all of them.
ALTER TABLE order_timeout_cancel_outbox MODIFY order_id VARBINARY(512) NOT NULL;
