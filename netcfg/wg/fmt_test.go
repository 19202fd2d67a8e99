package wg

import (
	"encoding/json"
	"fmt"
)

// fmtAll renders v every way a key could leak: the fmt verbs and JSON.
func fmtAll(v any) string {
	j, _ := json.Marshal(v)
	return fmt.Sprintf("%v %+v %#v %s %x %q", v, v, v, v, v, v) + string(j)
}
