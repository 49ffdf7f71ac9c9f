// Package routes loads, validates and matches a Hermes routes file (routes.yaml).
//
// A routes file maps tool calls to actions:
//
//	version: 1.0
//	rules:
//	  - name: get_policy_status_by_name
//	    match:
//	      tool_name: get_policy_status
//	      intent_regex: "^查询.*?([\\u4e00-\\u9fa5]{2,4})的"
//	    action:
//	      http:
//	        url: http://policy-service:8000/v1/policy/status
//	        method: GET
//	        timeout_ms: 4000
//	        headers:
//	          X-Auth-Token: ${env.POLICY_TOKEN}
//	        retry: {max_attempts: 3, backoff_factor: 2, jitter_ms: 100}
//
// # Matching
//
// [Table.Match] tries the rules in file order and returns the first one whose conditions all
// hold: tool_name equals the call's name; when intent_contains is given, at least one of its
// keywords is a substring of the intent; when intent_regex is given, it matches at the start of
// the intent, like Python's re.match. A rule without intent conditions matches on the tool name
// alone. The regexp's capture groups become parameters of the call: named groups by name,
// unnamed ones as match_N where N is the group's number (Python's numbering, named groups
// included); a group that did not take part in the match is left out.
//
// intent_regex is written the way Python reads it and run by Go's RE2 (linear time):
//
//   - \uXXXX and \UXXXXXXXX become \x{…}; an escaped backslash followed by u stays literal;
//   - \d, \w and \s (and \D, \W, \S outside character classes) match Unicode, as in Python 3;
//   - \Z becomes \z, and (?P<name>…) works as is;
//   - lookaround, backreferences and other syntax RE2 lacks are load errors.
//
// Known differences left: \b is ASCII-based, and $ does not match before a final newline.
//
// # Validation
//
// [Load] and [Parse] accept a file only if every field is known and valid. The first problem
// found (rules are checked in file order) is returned as a [*LoadError] naming the file, the
// line, the field path (for example rules[1].match.tool_name) and the reason. Every *LoadError matches [ErrInvalid]. Error
// messages never quote header values or URLs, which may hold secrets.
//
// Defaults are applied at load time, so a [Rule]'s Action is complete: method POST,
// protocol.DefaultTimeoutMS, and the protocol.Default* retry policy. Header values keep their
// ${env.NAME} placeholders; they are resolved only by the worker that runs the call.
//
// # Concurrency
//
// A [Table] is immutable once loaded: Match and ToolNames are safe for concurrent use, and the
// Rules, their Match and their Action (including header maps) must not be modified. Replacing
// a table means loading a new one; [Watch] does that when the file changes and keeps the last
// good table when a reload fails.
package routes
