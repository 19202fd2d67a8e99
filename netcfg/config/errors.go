package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// FieldError is one problem in a config file, located by line and field path.
type FieldError struct {
	// File is the path as given to Parse or Load; empty for a config built in code.
	File string
	// Line is 1-based; 0 when unknown (a config built in code, or a
	// problem that belongs to no line).
	Line int
	// Field is the path of the offending field, like vlans[1].id,
	// routing.rules[0].table, sysctls.net.ipv4.ip_forward or
	// kubernetes.labels["foo/bar"]. Empty for problems with the whole file.
	Field string
	// Msg says what is wrong, lowercase.
	Msg string
	// more marks the "and N more" line of a capped list, which sorts last.
	more bool
}

// moreErrors is the line that ends a capped list.
func moreErrors(file string, n int, where string) *FieldError {
	return &FieldError{File: file, Msg: fmt.Sprintf("and %d more error(s) %s, not listed", n, where), more: true}
}

// Error formats e as file:line: field: msg, leaving out the parts that are unknown.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteString(":")
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is every problem found in one config. Parse and Validate
// collect all of them rather than stopping at the first, so an operator
// fixes a file in one pass.
type ErrorList []*FieldError

// Error joins the errors with newlines, ordered by line.
func (l ErrorList) Error() string {
	s := l.sorted()
	lines := make([]string, len(s))
	for i, e := range s {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the errors, so errors.As finds a *FieldError.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// sorted returns a copy of l ordered by line; errors on one line keep the
// order they were found in.
func (l ErrorList) sorted() ErrorList {
	s := slices.Clone(l)
	slices.SortStableFunc(s, func(a, b *FieldError) int {
		if a.more != b.more {
			if a.more {
				return 1
			}
			return -1
		}
		return a.Line - b.Line
	})
	return s
}

// err returns l sorted as an error, or nil when l is empty. It exists so a
// nil ErrorList never becomes a non-nil error interface.
func (l ErrorList) err() error {
	if len(l) == 0 {
		return nil
	}
	return l.sorted()
}
