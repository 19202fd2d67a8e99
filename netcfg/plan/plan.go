// Package plan holds what every subsystem's plan has in common: an ordered
// list of changes, one per object, whose text is the dry run that
// `nodeagent plan` prints.
package plan

import (
	"fmt"
	"strings"
)

// Ops is an ordered list of changes. Subsystem plans embed it, so each has
// the same Ops field, Empty and String.
type Ops[O fmt.Stringer] []O

// Empty reports whether the plan changes and reports nothing.
func (p Ops[O]) Empty() bool { return len(p) == 0 }

// String is the dry-run text: one line per object, `+ ~ - !` first.
func (p Ops[O]) String() string {
	var b strings.Builder
	for _, o := range p {
		b.WriteString(o.String())
		b.WriteByte('\n')
	}
	return b.String()
}
