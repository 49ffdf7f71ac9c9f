// Package record reads Hermes' record — the HERMES stream, where every message of every session
// is kept — back for people: a session's whole history in stream order ([ReadSession], [Read]),
// the live flow of new messages ([Follow]), both on one consumer ([Stream]), the sessions with
// the latest requests ([RecentSessions]), and one line of text ([Formatter]) or one JSON object
// ([JSON]) per message.
//
// Guarantees:
//   - Reading never changes the record and never disturbs Hermes' own consumers: it uses ordered
//     consumers (ephemeral, in memory, no acks), deleted when reading ends and expired by the
//     server soon after if the reader dies.
//   - [Read] and [ReadSession] deliver messages in stream order and return once they have
//     delivered every matching message that was in the stream when they started; they do not
//     wait for new ones, and return at once when nothing matches (an empty or unknown session).
//   - [Follow] delivers, in stream order, every matching message stored after it started, until
//     its context ends; it survives reconnects and server restarts.
//   - [Stream] delivers what [Read] would and then what [Follow] would, from one ordered
//     consumer: nothing between the two is skipped or delivered twice.
//   - A message that cannot be decoded is delivered as an [Entry] with Err set, never dropped
//     and never an error that stops the reading.
//   - Stream order is the order the server stored messages in. Per call it is causal (request,
//     dispatch, each try's start, result), and a response follows every dispatch and start of
//     its request; but a response may be stored a moment before the result message of a call
//     that finished at the same time (results are recorded in KV before they are published, and
//     routers aggregate from KV). Readers show the record as it is; they never reorder it.
//   - Session ids are validated as subject tokens before they become filters, so a session
//     named "*" or ">" cannot read other sessions.
package record
