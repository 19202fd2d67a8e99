// Package cred reads a credentials file: a user name and a password, for
// PIA's account (pia.credentialsFile) and for a download client's web UI
// or RPC (the shipped port hooks' --credentials). One format is read
// everywhere, in any of three spellings:
//
//	username=p1234567          lines KEY=VALUE; the value is everything
//	password=the password      after the '=', as it is
//
//	p1234567                   two lines: the user name, then the
//	the password               password (PIA's own scripts' way)
//
//	username: p1234567         YAML: a map of username and password
//	password: "the password"
//
// In the KEY=VALUE and YAML spellings, blank lines and lines starting
// with '#' are comments. A line may end in CRLF. Anything else (another
// key, a third bare line, a key given twice, a missing or empty value, a
// control character in a value) is refused.
//
// The file is opened as every secret is (netcfg/fsafe): not through a
// link, without blocking, a regular file owned by root (or by the user
// reading it) and readable by its owner only, at most MaxSize bytes. No
// error quotes what the file holds: a line is named by its number.
package cred

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

// Creds are a user name and its password.
type Creds struct {
	Username string
	Password Secret
}

// MaxSize bounds a credentials file: two short lines and some comments.
const MaxSize = 4 << 10

// Rules are how a credentials file is opened: not through a link, without
// blocking, owned by root, readable by nobody else, and small.
var Rules = fsafe.Rules{MaxSize: MaxSize, Private: true, RootOwned: true}

// Format is the format in one line, for errors and help.
const Format = "username=NAME and password=SECRET lines, two bare lines (the name, then the password), or YAML {username: NAME, password: SECRET}"

// Read reads the credentials file at path under Rules. Its errors name the
// file (and the line) and never quote it.
func Read(path string) (Creds, error) {
	b, err := fsafe.ReadFile(path, Rules)
	if err != nil {
		return Creds{}, err
	}
	c, err := Parse(b)
	if err != nil {
		return Creds{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse parses a credentials file's content. Its errors never quote it.
func Parse(b []byte) (Creds, error) {
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf")) // a BOM some editors write
	if len(bytes.TrimSpace(b)) == 0 {
		return Creds{}, errors.New("is empty; want " + Format)
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	var c Creds
	var err error
	switch first := firstLine(lines); {
	case keyValue(first):
		c, err = parseKeyValue(lines)
	case strings.HasPrefix(first, "username:") || strings.HasPrefix(first, "password:") ||
		strings.HasPrefix(first, "{") || first == "---":
		c, err = parseYAML(b)
	default:
		c, err = parseBare(lines)
	}
	if err != nil {
		return Creds{}, err
	}
	return c, nil
}

// firstLine is the first line that is neither blank nor a comment.
func firstLine(lines []string) string {
	for _, l := range lines {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			return t
		}
	}
	return ""
}

// keyValue reports whether line is a username= or password= line, or
// one meant as such with spaces before its '='.
func keyValue(line string) bool {
	for _, k := range []string{"username", "password"} {
		if rest, ok := strings.CutPrefix(line, k); ok && strings.HasPrefix(strings.TrimLeft(rest, " \t"), "=") {
			return true
		}
	}
	return false
}

// parseKeyValue reads username= and password= lines.
func parseKeyValue(lines []string) (Creds, error) {
	var user, pass string
	var userAt, passAt int
	for i, l := range lines {
		n := i + 1
		if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		key, val, ok := strings.Cut(l, "=")
		switch k := strings.TrimSpace(key); {
		case ok && k != key && (k == "username" || k == "password"):
			return Creds{}, fmt.Errorf("line %d: spaces around %s's '='; write %s=VALUE, the value being everything after the '='", n, k, k)
		case ok && key == "username" && userAt != 0:
			return Creds{}, fmt.Errorf("line %d: a second username= (the first is on line %d)", n, userAt)
		case ok && key == "username":
			user, userAt = val, n
		case ok && key == "password" && passAt != 0:
			return Creds{}, fmt.Errorf("line %d: a second password= (the first is on line %d)", n, passAt)
		case ok && key == "password":
			pass, passAt = val, n
		default:
			return Creds{}, fmt.Errorf("line %d: not a username= or password= line; want %s", n, Format)
		}
	}
	switch {
	case userAt == 0:
		return Creds{}, errors.New("no username= line")
	case passAt == 0:
		return Creds{}, errors.New("no password= line")
	}
	return check(user, pass, fmt.Sprintf(" (line %d)", userAt), fmt.Sprintf(" (line %d)", passAt))
}

// parseBare reads two bare lines, the user name, then the password, each
// with the spaces around it trimmed.
func parseBare(lines []string) (Creds, error) {
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) != 2 {
		return Creds{}, fmt.Errorf("has %d lines; want 2 (username, then password), or username=NAME and password=SECRET lines, or YAML {username: NAME, password: SECRET}", len(lines))
	}
	return check(strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1]), " (line 1)", " (line 2)")
}

// parseYAML reads YAML {username: ..., password: ...}: one document, no
// other key.
func parseYAML(b []byte) (Creds, error) {
	var y struct {
		Username *string `yaml:"username"`
		Password *string `yaml:"password"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&y); err != nil {
		// yaml's errors may quote the file: only where it went wrong.
		return Creds{}, fmt.Errorf("not YAML of the form {username: NAME, password: SECRET}%s", yamlLine(err))
	}
	var more yaml.Node
	if err := dec.Decode(&more); err != io.EOF {
		return Creds{}, errors.New("holds more than one YAML document; want one {username: NAME, password: SECRET}")
	}
	switch {
	case y.Username == nil:
		return Creds{}, errors.New("no username")
	case y.Password == nil:
		return Creds{}, errors.New("no password")
	}
	return check(*y.Username, *y.Password, "", "")
}

// yamlLine is " (line N)" for a yaml error that names its line, else "".
func yamlLine(err error) string {
	var n int
	s := err.Error()
	if i := strings.Index(s, "line "); i >= 0 {
		if _, e := fmt.Sscanf(s[i:], "line %d", &n); e == nil && n > 0 {
			return fmt.Sprintf(" (line %d)", n)
		}
	}
	return ""
}

// check refuses an empty value or one with a control character (a tab
// aside), which no web form or API takes and which would end a line.
func check(user, pass, userAt, passAt string) (Creds, error) {
	switch {
	case user == "":
		return Creds{}, errors.New("the username is empty" + userAt)
	case pass == "":
		return Creds{}, errors.New("the password is empty" + passAt)
	case control(user):
		return Creds{}, errors.New("a control character in the username" + userAt)
	case control(pass):
		return Creds{}, errors.New("a control character in the password" + passAt)
	}
	return Creds{Username: user, Password: Secret(pass)}, nil
}

func control(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f })
}
