package routes

import (
	"bytes"
	"errors"
	"io"

	"gopkg.in/yaml.v3"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// What routes files share with other YAML documents Hermes reads (tool contracts): the same
// text checks and syntax errors, and the same action blocks.

// Documents parses data as one or more YAML documents ("---" between them) with the checks a
// routes file gets: UTF-8 and printable text, syntax errors with their line. Errors are
// *LoadError naming file. Empty documents are skipped.
func Documents(file string, data []byte) (docs []*yaml.Node, err error) {
	d := &decoder{file: file}
	if line, reason := scanText(data); reason != "" {
		return nil, d.errorf(line, "", "%s", reason)
	}
	defer func() {
		if r := recover(); r != nil {
			docs, err = nil, d.errorf(1, "", "invalid YAML: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, d.syntaxError(data, err)
		}
		if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 && !isNull(doc.Content[0]) {
			docs = append(docs, doc.Content[0])
		}
	}
}

// ParseAction decodes an action block — exactly one of http, go and grpc, as in a rule's
// action — from value (key is its key, for the line of a missing field), at field path, with
// every check a routes file's action gets (URLs, methods, headers, credential literals, timing
// bounds). Errors are *LoadError naming file.
func ParseAction(file string, key, value *yaml.Node, path string) (protocol.Action, error) {
	d := &decoder{file: file}
	return d.action(entry{key: key, value: value}, path)
}
