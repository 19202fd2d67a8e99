package agent

import (
	"slices"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/lint"
)

// Warnings are c's lint warnings as status, plan and validate print them.
func Warnings(c *config.Config) []string {
	var out []string
	for _, w := range lint.Check(c) {
		out = append(out, w.Error())
	}
	return out
}

// setWarnings publishes the warnings of a config just loaded, and logs
// each once: at the first load, and when a reload changes them.
func (d *Daemon) setWarnings(c *config.Config) {
	ws := Warnings(c)
	d.mu.Lock()
	changed := !slices.Equal(d.status.Warnings, ws)
	d.status.Warnings = ws
	d.mu.Unlock()
	if !changed {
		return
	}
	for _, w := range ws {
		d.log.Warn("config warning", "warning", w)
	}
}
