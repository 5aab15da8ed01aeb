// Package executor: this file is NOT part of Argo. durapipe adds it to Argo's
// workflow/executor package at build time with `go test -overlay` (docs/argo-harness.md).
//
// A resource template's successCondition/failureCondition are evaluated by argoexec inside
// the pod, not by the controller, so the controller harness cannot see them. This test feeds
// resource states (e.g. a JobSet's status) to the executor's own matchConditions, parsed
// exactly as WaitResource parses them, and reports each verdict as JSON.
package executor

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/argoproj/argo-workflows/v4/util/logging"
)

type condCase struct {
	Name             string          `json:"name"`
	SuccessCondition string          `json:"successCondition"`
	FailureCondition string          `json:"failureCondition"`
	Object           json.RawMessage `json:"object"`
}

type condResult struct {
	Name string `json:"name"`
	// succeeded | failed | waiting | invalid
	Verdict string `json:"verdict"`
	Error   string `json:"error,omitempty"`
}

func parseReqs(s string) (labels.Requirements, error) {
	if s == "" {
		return nil, nil
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, err
	}
	reqs, _ := sel.Requirements()
	return reqs, nil
}

func TestArgoSimConditions(t *testing.T) {
	in, out := os.Getenv("ARGOSIM_IN"), os.Getenv("ARGOSIM_OUT")
	if in == "" || out == "" {
		t.Skip("ARGOSIM_IN/ARGOSIM_OUT not set: run through tests/argo/argo_tools.py")
	}
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	var cases []condCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	ctx := logging.TestContext(context.Background())
	results := []condResult{}
	for _, c := range cases {
		r := condResult{Name: c.Name}
		succ, err1 := parseReqs(c.SuccessCondition)
		fail, err2 := parseReqs(c.FailureCondition)
		switch {
		case err1 != nil:
			r.Verdict, r.Error = "invalid", err1.Error()
		case err2 != nil:
			r.Verdict, r.Error = "invalid", err2.Error()
		default:
			retry, err := matchConditions(ctx, c.Object, succ, fail)
			switch {
			case err == nil:
				r.Verdict = "succeeded"
			case retry:
				r.Verdict = "waiting"
			default:
				r.Verdict, r.Error = "failed", err.Error()
			}
		}
		results = append(results, r)
	}
	b, _ := json.MarshalIndent(results, "", "  ")
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
