// Package audit projects the record into tables of PostgreSQL, for operators and auditors who
// live in SQL: requests and who made them, their steps, policy decisions and approvals,
// blueprint runs, coordination transactions, the model's decisions. It keeps what happened,
// never what was said: of a call's arguments and of its result only a Digest (kind, size,
// count, field names).
//
// Service reads every record stream through a durable consumer of its own and writes in
// batches, one transaction each, acknowledged after the commit; every row is an upsert keyed
// by ids of the record, so a message written twice (a crash between commit and ack, a replay
// of the whole record) leaves the same rows. Migrate brings the schema to this Hermes'
// version, recorded in hermes_audit_schema. A record it cannot read becomes a row of
// hermes_audit_errors with the reason.
package audit
