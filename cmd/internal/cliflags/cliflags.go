// Package cliflags holds what nodeagent's two commands share in reading
// their arguments.
package cliflags

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// SingleDashLong refuses a long flag written with one dash, as in
// "-config FILE": pflag would read it as the shorthand -c with the value
// "onfig", and the command would quietly use a file of that name.
func SingleDashLong(fs *pflag.FlagSet, args []string) error {
	for _, a := range args {
		if a == "--" {
			return nil
		}
		if len(a) < 3 || a[0] != '-' || a[1] == '-' {
			continue
		}
		name, _, _ := strings.Cut(a[1:], "=")
		if f := fs.Lookup(name); f != nil {
			alt := ""
			if f.Shorthand != "" {
				alt = " (or -" + f.Shorthand + ")"
			}
			return fmt.Errorf("%s: a long flag takes two dashes: --%s%s", a, name, alt)
		}
	}
	return nil
}
