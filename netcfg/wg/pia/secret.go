package pia

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"gopkg.in/yaml.v3"
)

// Secret is a token or a password: it never prints in any format, so one
// that ends up in an error, a log line or a %+v dump shows nothing.
type Secret string

const redacted = "(redacted)"

// String, GoString, Format and MarshalText print "(redacted)".
func (Secret) String() string               { return redacted }
func (Secret) GoString() string             { return redacted }
func (Secret) Format(f fmt.State, _ rune)   { io.WriteString(f, redacted) }
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Value is the secret itself, for the one place that sends it.
func (s Secret) Value() string { return string(s) }

// Creds are a PIA account's username and password.
type Creds struct {
	Username string
	Password Secret
}

// credsRules are how the credentials file is opened: not through a link,
// without blocking, owned by root, readable by nobody else, and small.
var credsRules = fsafe.Rules{MaxSize: 4 << 10, Private: true, RootOwned: true}

// ReadCreds reads a credentials file: two lines (username, then
// password), or YAML {username: ..., password: ...}. No error quotes the
// file.
func ReadCreds(path string) (Creds, error) {
	b, err := fsafe.ReadFile(path, credsRules)
	if err != nil {
		return Creds{}, err
	}
	c, err := parseCreds(b)
	if err != nil {
		return Creds{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func parseCreds(b []byte) (Creds, error) {
	var y struct {
		Username string `yaml:"username"`
		Password string `yaml:"password"`
	}
	if bytes.Contains(b, []byte("username:")) {
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&y); err != nil {
			return Creds{}, errors.New("not YAML of the form {username: ..., password: ...}")
		}
	} else {
		lines := strings.Split(strings.TrimRight(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n"), "\n")
		if len(lines) != 2 {
			return Creds{}, fmt.Errorf("has %d lines; want 2 (username, then password) or YAML {username, password}", len(lines))
		}
		y.Username, y.Password = strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1])
	}
	switch {
	case y.Username == "":
		return Creds{}, errors.New("no username")
	case y.Password == "":
		return Creds{}, errors.New("no password")
	case strings.ContainsAny(y.Username+y.Password, "\x00\n"):
		return Creds{}, errors.New("a control character in the username or password")
	}
	return Creds{Username: y.Username, Password: Secret(y.Password)}, nil
}
