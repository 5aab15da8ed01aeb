// Command argo-check runs Argo Workflows' own offline validation (what `argo lint --offline`
// runs) over YAML/JSON manifests and prints one JSON line per Argo object.
//
// The `argo` CLI itself cannot be built from the Go module proxy (it embeds the UI), so this
// calls the same validate.Validate* functions that the CLI's offline service clients call, with
// the same options (strict decoding, Lint: true). Unlike `argo lint`, an object that fails to
// decode is reported as a failure instead of being skipped, and WorkflowTemplates without a
// namespace resolve `templateRef`s of objects without a namespace (argo lint would look them
// up under the kubeconfig's namespace and miss them).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	wf "github.com/argoproj/argo-workflows/v4/pkg/apis/workflow"
	wfv1 "github.com/argoproj/argo-workflows/v4/pkg/apis/workflow/v1alpha1"
	fileutil "github.com/argoproj/argo-workflows/v4/util/file"
	"github.com/argoproj/argo-workflows/v4/util/logging"
	"github.com/argoproj/argo-workflows/v4/workflow/common"
	"github.com/argoproj/argo-workflows/v4/workflow/templateresolution"
	"github.com/argoproj/argo-workflows/v4/workflow/validate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Result is one validated object; the Python helper parses exactly these keys.
type Result struct {
	File  string `json:"file"`
	Index int    `json:"index"`
	Kind  string `json:"kind"`
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

type nsTemplates map[string]*wfv1.WorkflowTemplate

func (m nsTemplates) Get(_ context.Context, name string) (*wfv1.WorkflowTemplate, error) {
	if t, ok := m[name]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("couldn't find workflow template %q", name)
}

type clusterTemplates map[string]*wfv1.ClusterWorkflowTemplate

func (m clusterTemplates) Get(_ context.Context, name string) (*wfv1.ClusterWorkflowTemplate, error) {
	if t, ok := m[name]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("couldn't find cluster workflow template %q", name)
}

type parsed struct {
	file  string
	index int
	obj   metav1.Object
	err   error
}

func kindOf(obj metav1.Object) string {
	switch obj.(type) {
	case *wfv1.Workflow:
		return wf.WorkflowKind
	case *wfv1.WorkflowTemplate:
		return wf.WorkflowTemplateKind
	case *wfv1.ClusterWorkflowTemplate:
		return wf.ClusterWorkflowTemplateKind
	case *wfv1.CronWorkflow:
		return wf.CronWorkflowKind
	}
	return ""
}

func main() {
	namespace := flag.String("namespace", "", "namespace of objects that name none")
	lax := flag.Bool("lax", false, "do not reject unknown fields (argo lint --strict=false)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: argo-check [-namespace NS] [-lax] FILE|DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	// Argo logs warnings (e.g. deprecated fields) through the context logger; keep stdout JSON.
	logger := logging.NewSlogLoggerCustom(logging.Error, logging.Text, os.Stderr)
	ctx := logging.WithLogger(context.Background(), logger)

	var objs []parsed
	for _, path := range flag.Args() {
		err := fileutil.WalkManifests(ctx, path, func(file string, data []byte) error {
			for i, pr := range common.ParseObjects(ctx, data, !*lax) {
				objs = append(objs, parsed{file, i, pr.Object, pr.Err})
			}
			return nil
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "argo-check: %s: %v\n", path, err)
			os.Exit(2)
		}
	}

	// Templates are indexed before anything is validated so that a templateRef may point at a
	// file given later on the command line, as with `argo lint --offline`.
	byNS := map[string]nsTemplates{}
	cluster := clusterTemplates{}
	nsOf := func(o metav1.Object) string {
		if o.GetNamespace() != "" {
			return o.GetNamespace()
		}
		return *namespace
	}
	for _, p := range objs {
		switch v := p.obj.(type) {
		case *wfv1.WorkflowTemplate:
			if byNS[nsOf(v)] == nil {
				byNS[nsOf(v)] = nsTemplates{}
			}
			byNS[nsOf(v)][v.Name] = v
		case *wfv1.ClusterWorkflowTemplate:
			cluster[v.Name] = v
		}
	}
	getter := func(o metav1.Object) templateresolution.WorkflowTemplateNamespacedGetter {
		if g := byNS[nsOf(o)]; g != nil {
			return g
		}
		return nsTemplates{}
	}

	failed := false
	enc := json.NewEncoder(os.Stdout)
	lint := validate.Opts{Lint: true}
	for _, p := range objs {
		kind := ""
		name := ""
		if p.obj != nil {
			kind = kindOf(p.obj)
			name = p.obj.GetName()
			if name == "" {
				name = p.obj.GetGenerateName()
			}
		}
		err := p.err
		if err == nil {
			switch v := p.obj.(type) {
			case *wfv1.Workflow:
				err = validate.Workflow(ctx, getter(v), cluster, v, nil, lint)
			case *wfv1.WorkflowTemplate:
				err = validate.WorkflowTemplate(ctx, getter(v), cluster, v, nil, lint)
			case *wfv1.ClusterWorkflowTemplate:
				err = validate.ClusterWorkflowTemplate(ctx, nil, cluster, v, nil, lint)
			case *wfv1.CronWorkflow:
				err = validate.CronWorkflow(ctx, getter(v), cluster, v, nil)
			default:
				continue // other Argo kinds (WorkflowEventBinding, ...) are not linted by argo either
			}
		} else if kind == "" && p.obj != nil {
			continue
		}
		r := Result{File: p.file, Index: p.index, Kind: kind, Name: name, OK: err == nil}
		if err != nil {
			r.Error = err.Error()
			failed = true
		}
		_ = enc.Encode(r)
	}
	if failed {
		os.Exit(1)
	}
}
