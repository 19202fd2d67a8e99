package host

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestRtProtosEntryMatches keeps the packaged rt_protos.d entry in step
// with the protocol number the code stamps on routes, rules and addresses.
func TestRtProtosEntryMatches(t *testing.T) {
	b, err := os.ReadFile("../../packaging/rt_protos.d/nodeagent.conf")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d\tnodeagent", Proto)
	for _, l := range strings.Split(string(b), "\n") {
		if l == want {
			return
		}
	}
	t.Fatalf("packaging/rt_protos.d/nodeagent.conf lacks %q:\n%s", want, b)
}
