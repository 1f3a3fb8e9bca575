// Package eventschema validates event JSON against docs/events.schema.json
// (JSON Schema draft 2020-12, with formats asserted) using
// github.com/santhosh-tekuri/jsonschema/v6. Tests use it to check every
// event they see; the schema file is the contract published to consumers.
package eventschema

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Path is the schema's path relative to the module root.
const Path = "docs/events.schema.json"

// Schema is a compiled event schema. Safe for concurrent use.
type Schema struct{ s *jsonschema.Schema }

// Load compiles the schema at root/Path (root: the module root). Errors
// name the file.
func Load(root string) (*Schema, error) {
	file := filepath.Join(root, Path)
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("eventschema: %w", err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		return nil, fmt.Errorf("eventschema: %s: %w", file, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("events.schema.json", doc); err != nil {
		return nil, fmt.Errorf("eventschema: %s: %w", file, err)
	}
	s, err := c.Compile("events.schema.json")
	if err != nil {
		return nil, fmt.Errorf("eventschema: %s: %w", file, err)
	}
	return &Schema{s: s}, nil
}

// Validate checks one event's JSON; the error says which field breaks
// which rule.
func (s *Schema) Validate(data []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("eventschema: not JSON: %w", err)
	}
	if err := s.s.Validate(v); err != nil {
		return fmt.Errorf("eventschema: %s: %w", data, err)
	}
	return nil
}
