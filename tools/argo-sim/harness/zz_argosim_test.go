// Package controller: this file is NOT part of Argo. durapipe adds it to Argo's
// workflow/controller package at build time with `go test -overlay` (see
// docs/argo-harness.md), so that it can use Argo's own in-package test helpers
// (newController, newWorkflowOperationCtx, woc.operate) without copying any Argo code.
//
// TestArgoSim reads a scenario (JSON, path in $ARGOSIM_IN), steps Argo's real operator
// synchronously over fake Kubernetes/Argo clientsets, plays the kubelet for every pod the
// controller creates according to the scenario's per-attempt outcomes, and writes a report
// (JSON, path in $ARGOSIM_OUT): every node, the pod spec each attempt got, and the
// workflow's final phase.
package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	apierr "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/yaml"

	"github.com/argoproj/argo-workflows/v4/pkg/apis/workflow"
	wfv1 "github.com/argoproj/argo-workflows/v4/pkg/apis/workflow/v1alpha1"
	"github.com/argoproj/argo-workflows/v4/util/logging"
	"github.com/argoproj/argo-workflows/v4/workflow/common"
	controllercache "github.com/argoproj/argo-workflows/v4/workflow/controller/cache"
)

// simNodeName is the node every pod that leaves Pending runs on.
const simNodeName = "argosim-node"

// simOutcome is what the simulated kubelet does with one pod (one attempt).
type simOutcome struct {
	// succeeded | failed | oomkilled | deleted | deleted-pending | disrupted | shutdown | pending | lost
	Outcome string `json:"outcome"`
	// failed, oomkilled: the wait container ends with exit 1 and writes no task result (the
	// executor could not report), as on a control plane whose executor reports nothing.
	NoResult bool `json:"noResult,omitempty"`
	// failed: main's exit code (default 1); lost: main's exit code as the kubelet reported it
	// before the node went away (none: main was still running).
	ExitCode *int32 `json:"exitCode,omitempty"`
	// Termination message of main (what the durapipe runtime writes as its verdict).
	Message string `json:"message,omitempty"`
	// Termination message of main when a signal stops it first (a deadline: the controller's
	// or the pod's activeDeadlineSeconds): what the runtime writes on SIGTERM. Default: Message.
	TermMessage string `json:"termMessage,omitempty"`
	// Minutes main takes to exit after the kubelet's SIGTERM (the pod's activeDeadlineSeconds,
	// or a disruption): a final checkpoint save. The kubelet waits at most the pod's
	// terminationGracePeriodSeconds (30 s unless set), then SIGKILLs; meanwhile the pod stays
	// Running and holds its node. Default 0: main exits at once.
	TermMinutes float64 `json:"termMinutes,omitempty"`
	// Minutes the pod runs (or, for pending, stays unschedulable) on the simulated clock.
	Minutes float64 `json:"minutes,omitempty"`
	// pending: what happens after the wait ("" = stays pending for ever).
	Then *simOutcome `json:"then,omitempty"`
	// succeeded: output parameters, published through a WorkflowTaskResult like the executor.
	Outputs map[string]string `json:"outputs,omitempty"`
	// succeeded: the script/container `result` output.
	Result *string `json:"result,omitempty"`
}

type simRun struct {
	// Overrides of spec.arguments.parameters for this run (memoization scenarios resubmit).
	Parameters map[string]string `json:"parameters,omitempty"`
	// Outcomes per node key (a pod node's display name without its "(N)" retry suffix),
	// consumed in pod-creation order. A key with no outcome left succeeds. The key "*" serves
	// every key not listed, in pod-creation order across them: a scenario can script the n-th
	// attempt of a stage without naming the task Argo runs it in.
	Attempts map[string][]simOutcome `json:"attempts"`
}

type simScenario struct {
	Name              string            `json:"name"`
	Workflow          json.RawMessage   `json:"workflow"`
	WorkflowTemplates []json.RawMessage `json:"workflowTemplates,omitempty"`
	// Runs are separate submissions of the same workflow to one controller, so
	// memoization caches (ConfigMaps) carry over from one run to the next.
	Runs     []simRun `json:"runs"`
	MaxSteps int      `json:"maxSteps,omitempty"`
	// RecordWorkflow adds each run's final Workflow object to its report, as the API server
	// would return it (tests/cluster records them for `durapipe status`).
	RecordWorkflow bool `json:"recordWorkflow,omitempty"`
}

type podReport struct {
	Name                  string             `json:"name"`
	MemoryLimit           string             `json:"memoryLimit,omitempty"`
	MemoryRequest         string             `json:"memoryRequest,omitempty"`
	Limits                map[string]string  `json:"limits,omitempty"`
	NodeSelector          map[string]string  `json:"nodeSelector,omitempty"`
	Tolerations           []apiv1.Toleration `json:"tolerations,omitempty"`
	Affinity              *apiv1.Affinity    `json:"affinity,omitempty"`
	Env                   map[string]string  `json:"env,omitempty"`
	Args                  []string           `json:"args,omitempty"`
	ActiveDeadlineSeconds *int64             `json:"activeDeadlineSeconds,omitempty"`
	FinalPhase            string             `json:"finalPhase"`
	Deleted               bool               `json:"deleted"`
	// The controller deleted the pod before it finished (an expired pendingTimeout).
	DeletedByController bool `json:"deletedByController,omitempty"`
	// The controller signalled main to stop (a deadline) before its outcome was due.
	Signalled bool `json:"signalled,omitempty"`
	// The kubelet stopped the pod at its activeDeadlineSeconds before its outcome was due.
	DeadlineExceeded bool `json:"deadlineExceeded,omitempty"`
	// The pod's status.reason and status.message as the kubelet last wrote them.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type nodeReport struct {
	ID          string                  `json:"id"`
	Name        string                  `json:"name"`
	DisplayName string                  `json:"displayName"`
	Key         string                  `json:"key"`
	Attempt     int                     `json:"attempt"`
	Type        string                  `json:"type"`
	Template    string                  `json:"template,omitempty"`
	Phase       string                  `json:"phase"`
	Message     string                  `json:"message,omitempty"`
	ExitCode    string                  `json:"exitCode,omitempty"`
	Outputs     map[string]string       `json:"outputs,omitempty"`
	Memoization *wfv1.MemoizationStatus `json:"memoization,omitempty"`
	Children    []string                `json:"children,omitempty"`
	Outcome     string                  `json:"outcome,omitempty"`
	PodsCreated int                     `json:"podsCreated,omitempty"`
	Pod         *podReport              `json:"pod,omitempty"`
	// Simulated minutes from the workflow's start to the node's start and finish, so that a
	// scenario can assert the waits (pendingTimeout, backoff) that really passed.
	StartedMinute  *float64 `json:"startedMinute,omitempty"`
	FinishedMinute *float64 `json:"finishedMinute,omitempty"`
}

// minutesSince is t - origin in minutes, or nil for an unset time.
func minutesSince(origin, t metav1.Time) *float64 {
	if t.IsZero() || origin.IsZero() {
		return nil
	}
	m := t.Sub(origin.Time).Minutes()
	return &m
}

type runReport struct {
	Workflow string `json:"workflow"`
	Phase    string `json:"phase"`
	Message  string `json:"message,omitempty"`
	Steps    int    `json:"steps"`
	// From the workflow's start to its end (or to now, unended), on the controller's clock:
	// the simulated time spent and the real time the steps took, which pods' times count too.
	SimMinutes float64 `json:"simMinutes"`
	// Patches the controller sent to this run's pods (labelling a completed pod, removing a
	// finalizer): a completed pod is labelled once, so this stays near the number of pods.
	PodPatches int64 `json:"podPatches"`
	// Wall-clock seconds spent in Argo's reconciliation (woc.operate) and in the whole run, so
	// benchmarks can see how a reconciliation's cost grows with the workflow.
	OperateSeconds float64      `json:"operateSeconds"`
	Nodes          []nodeReport `json:"nodes"`
	// Pod nodes (attempts) in creation order, for easy assertions.
	Attempts []nodeReport   `json:"attempts"`
	Object   *wfv1.Workflow `json:"object,omitempty"`
}

type simReport struct {
	Scenario string      `json:"scenario"`
	Runs     []runReport `json:"runs"`
	Error    string      `json:"error,omitempty"`
}

var retrySuffix = regexp.MustCompile(`^(.*)\((\d+)\)$`)

// nodeKey turns "train(2)" into ("train", 2); a pod node outside a retry is attempt 0.
func nodeKey(display string) (string, int) {
	if m := retrySuffix.FindStringSubmatch(display); m != nil {
		var n int
		fmt.Sscanf(m[2], "%d", &n)
		return m[1], n
	}
	return display, 0
}

// keyOf names the step a node belongs to: its display name without the retry suffix, or
// the template name for the workflow's root (whose display name is the workflow's name).
func (s *simulator) keyOf(n *wfv1.NodeStatus) string {
	key, _ := nodeKey(n.DisplayName)
	if key == s.wf.Name {
		return n.TemplateName
	}
	return key
}

// simPod tracks the simulated kubelet's plan for one pod.
type simPod struct {
	name    string
	nodeID  string
	key     string
	outcome simOutcome
	stage   int // 0 created, 1 running/pending, 2 terminal, 3 lost (deleted at the next step)
	// When the pod's current wait ends (its outcome's minutes, a pending spell, main's exit
	// inside the grace), on the controller's clock: Argo reads time.Now(), so the real time a
	// step takes passes for the pod as it does for the controller's deadlines, and spend
	// moves it back with every recorded timestamp. Zero: no wait.
	due     time.Time
	deleted bool
	// Deleted by the controller before it finished (an expired pendingTimeout).
	deletedByController bool
	// Stopped by a signal from the controller (a deadline) before its outcome was due.
	signalled bool
	// Stopped by the kubelet at the pod's activeDeadlineSeconds.
	deadlineExceeded bool
	// SIGTERMed by the kubelet and still inside its grace period: ``stopped`` is what the
	// pod ends with when main exits (or the grace runs out).
	terminating bool
	stopped     simOutcome
	order       int
	// Scheduled only after a pending spell: it starts when the harness schedules it, not at
	// its creation.
	pended bool
}

type simulator struct {
	t       *testing.T
	ctx     context.Context
	c       *WorkflowController
	wf      *wfv1.Workflow
	pods    map[string]*simPod
	queues  map[string][]simOutcome
	elapsed time.Duration
	steps   int
	created int
	// Last seen state of every pod, so deleted pods still show the spec they got.
	podSnapshots map[string]*apiv1.Pod
	// How many pods the controller created for each node (re-creations included).
	podsPerNode map[string]int
	// controllerPodPatches when this run began.
	patchesAtStart int64
	operateTime    time.Duration
	// What the harness wrote since the last syncInformers, by name, and the last generation
	// it stamped on any object.
	unsyncedPods    map[string]bool
	unsyncedResults map[string]bool
	generation      int64
}

// annotationGeneration stamps every object the harness writes with a counter, so that it can
// tell whether an informer has caught up with that write.
const annotationGeneration = "argosim.durapipe.dev/generation"

// controllerPodPatches counts every pod patch the controller sends (the harness itself only
// updates pods). Reactors may run on the controller's goroutines, hence the atomic.
var controllerPodPatches atomic.Int64

const tick = 30 * time.Second

// advance moves the simulated clock forward by d. Argo reads time.Now() directly, so
// instead of moving "now" the harness moves every recorded timestamp into the past.
func (s *simulator) advance(d time.Duration) {
	s.elapsed += d
	back := func(t *metav1.Time) {
		if t != nil && !t.IsZero() {
			t.Time = t.Add(-d)
		}
	}
	back(&s.wf.Status.StartedAt)
	back(&s.wf.Status.FinishedAt)
	back(&s.wf.ObjectMeta.CreationTimestamp)
	for id, n := range s.wf.Status.Nodes {
		back(&n.StartedAt)
		back(&n.FinishedAt)
		s.wf.Status.Nodes[id] = n
	}
	pods := s.listPods()
	for i := range pods {
		p := &pods[i]
		// A finished pod whose node is settled is never read again for its times; rewriting
		// every pod every step would make a large workflow quadratic.
		if sp := s.pods[p.Name]; sp != nil && sp.stage == 2 {
			if n, err := s.wf.Status.Nodes.Get(sp.nodeID); err == nil && n.Fulfilled() {
				continue
			}
		}
		back(&p.CreationTimestamp)
		back(p.Status.StartTime)
		for j := range p.Status.Conditions {
			back(&p.Status.Conditions[j].LastTransitionTime)
		}
		s.updatePod(p)
	}
}

// simFatal is the harness's own failure, kept so that the report can say why it is partial.
var simFatal string

func (s *simulator) fatalf(format string, args ...any) {
	simFatal = fmt.Sprintf(format, args...)
	s.t.Fatal(simFatal)
}

// listPods lists this run's pods only: earlier runs' pods stay in the fake clientset.
func (s *simulator) listPods() []apiv1.Pod {
	list, err := s.c.kubeclientset.CoreV1().Pods(s.wf.Namespace).List(s.ctx, metav1.ListOptions{
		LabelSelector: common.LabelKeyWorkflow + "=" + s.wf.Name,
	})
	if err != nil {
		s.fatalf("list pods: %v", err)
	}
	return list.Items
}

// updatePod writes the pod through the API only. Writing the informer's store as well (as
// Argo's own tests do) let the informer's goroutine, when it lagged, later apply the older
// events still queued for that pod and move the store back in time: the controller then saw a
// running pod as Pending, and re-created it when it was deleted. syncInformers waits instead.
func (s *simulator) updatePod(p *apiv1.Pod) {
	s.stamp(&p.ObjectMeta)
	s.unsyncedPods[p.Name] = true
	podcs := s.c.kubeclientset.CoreV1().Pods(s.wf.Namespace)
	if _, err := podcs.Update(s.ctx, p, metav1.UpdateOptions{}); err != nil {
		s.fatalf("update pod %s: %v", p.Name, err)
	}
}

func (s *simulator) stamp(meta *metav1.ObjectMeta) {
	s.generation++
	if meta.Annotations == nil {
		meta.Annotations = map[string]string{}
	}
	meta.Annotations[annotationGeneration] = strconv.FormatInt(s.generation, 10)
}

func generationOf(obj any) int64 {
	meta, ok := obj.(metav1.Object)
	if !ok {
		return -1
	}
	g, err := strconv.ParseInt(meta.GetAnnotations()[annotationGeneration], 10, 64)
	if err != nil {
		return -1
	}
	return g
}

// syncInformers waits until the controller's pod and task-result informers hold what the API
// holds for every object the harness wrote since the last call: a real kubelet's writes reach
// the controller in order too, and the controller acts on none of them before it sees them.
// One watch carries all of a kind's events in order, so once each write is seen, no older event
// is still on its way.
func (s *simulator) syncInformers() {
	if len(s.unsyncedPods) == 0 && len(s.unsyncedResults) == 0 {
		return
	}
	podStore := s.c.PodController.TestingPodInformer().GetStore()
	resultStore := s.c.taskResultInformer.GetStore()
	podcs := s.c.kubeclientset.CoreV1().Pods(s.wf.Namespace)
	results := s.c.wfclientset.ArgoprojV1alpha1().WorkflowTaskResults(s.wf.Namespace)
	caughtUp := func(store cache.Store, name string, current metav1.Object, watched bool) bool {
		held, exists, err := store.GetByKey(s.wf.Namespace + "/" + name)
		if err != nil {
			s.fatalf("informer store: %v", err)
		}
		if current == nil || !watched {
			return !exists
		}
		return exists && generationOf(held) == generationOf(current)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		for name := range s.unsyncedPods {
			var current metav1.Object
			watched := false
			if p, err := podcs.Get(s.ctx, name, metav1.GetOptions{}); err == nil {
				current = p
				watched = podWatchSelector().Matches(labels.Set(p.Labels))
			} else if !apierr.IsNotFound(err) {
				s.fatalf("get pod %s: %v", name, err)
			}
			if caughtUp(podStore, name, current, watched) {
				delete(s.unsyncedPods, name)
			}
		}
		for name := range s.unsyncedResults {
			var current metav1.Object
			if r, err := results.Get(s.ctx, name, metav1.GetOptions{}); err == nil {
				current = r
			} else if !apierr.IsNotFound(err) {
				s.fatalf("get task result %s: %v", name, err)
			}
			if caughtUp(resultStore, name, current, true) {
				delete(s.unsyncedResults, name)
			}
		}
		if len(s.unsyncedPods) == 0 && len(s.unsyncedResults) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.fatalf("the informers did not catch up within 30s: pods %v, task results %v",
				s.unsyncedPods, s.unsyncedResults)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func (s *simulator) operate() {
	s.syncInformers()
	s.steps++
	began := time.Now()
	woc := newWorkflowOperationCtx(s.ctx, s.wf, s.c)
	woc.operate(s.ctx)
	s.operateTime += time.Since(began)
	s.wf = woc.wf
	// What a cleanup worker of the real controller does next: delete the Pending pod of an
	// expired pendingTimeout, label completed pods, pod GC, stop pods past a deadline.
	processed, signals := s.c.PodController.ArgosimDrainCleanup(s.ctx)
	if processed > 0 {
		s.awaitPodInformer()
	}
	for _, sig := range signals {
		s.signal(sig.Pod, sig.Kill)
	}
}

// signal plays the kubelet when the controller signals a pod's containers: a running main
// ends at once with the signal's exit code (143 for SIGTERM, 137 for SIGKILL).
func (s *simulator) signal(podName string, kill bool) {
	sp := s.pods[podName]
	if sp == nil || sp.stage != 1 {
		return
	}
	p, err := s.c.kubeclientset.CoreV1().Pods(s.wf.Namespace).Get(s.ctx, podName, metav1.GetOptions{})
	if err != nil || p.Status.Phase != apiv1.PodRunning {
		return
	}
	code := int32(143)
	if kill {
		code = 137
	}
	sp.signalled = true
	s.finish(sp, p, simOutcome{Outcome: "failed", ExitCode: &code, Message: sp.outcome.termMessage()})
}

func (o simOutcome) termMessage() string {
	if o.TermMessage != "" {
		return o.TermMessage
	}
	return o.Message
}

// The kubelet's words for a pod past its activeDeadlineSeconds (k8s v1.35
// pkg/kubelet/active_deadline.go).
const (
	deadlineReason  = "DeadlineExceeded"
	deadlineMessage = "Pod was active on the node longer than the specified deadline"
)

// deadlineLeft is how long a running pod has until its activeDeadlineSeconds, counted as the
// kubelet counts it: from status.startTime (a pod that never started has no deadline yet).
func deadlineLeft(p *apiv1.Pod) (time.Duration, bool) {
	if p.Spec.ActiveDeadlineSeconds == nil || p.Status.StartTime == nil || p.Status.StartTime.IsZero() {
		return 0, false
	}
	allowed := time.Duration(*p.Spec.ActiveDeadlineSeconds) * time.Second
	return allowed - time.Since(p.Status.StartTime.Time), true
}

// exceedDeadline plays the kubelet for a pod past its activeDeadlineSeconds (k8s v1.35): the
// active-deadline handler asks for the pod's eviction with reason DeadlineExceeded
// (generateAPIPodStatus sets phase Failed, that reason and message), the pod worker stops its
// containers with SIGTERM (SIGKILL after the grace period), and the status manager reports
// the terminal phase only once no container runs (mergePodStatus). The runtime in main exits
// 143 on SIGTERM within the grace period, so main ends at once with 143 and the runtime's
// SIGTERM verdict, and the pod turns Failed in the same write.
func (s *simulator) exceedDeadline(sp *simPod, p *apiv1.Pod) {
	code := int32(143)
	sp.deadlineExceeded = true
	// The wait that ended is the deadline's, not the outcome's.
	sp.due = p.Status.StartTime.Add(time.Duration(*p.Spec.ActiveDeadlineSeconds) * time.Second)
	s.stop(sp, p, simOutcome{Outcome: "deadline", ExitCode: &code, Message: sp.outcome.termMessage()})
}

// terminationGrace is the pod's terminationGracePeriodSeconds (Kubernetes' default, 30 s,
// where the spec leaves it unset): how long the kubelet waits after SIGTERM before SIGKILL.
func terminationGrace(p *apiv1.Pod) time.Duration {
	if p.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// stop plays the kubelet's SIGTERM to a running main: the pod ends with o once main has
// taken its termMinutes to exit, or at once when it takes none; never later than the grace.
func (s *simulator) stop(sp *simPod, p *apiv1.Pod, o simOutcome) {
	term := time.Duration(sp.outcome.TermMinutes * float64(time.Minute))
	if grace := terminationGrace(p); term > grace {
		term = grace
	}
	if term <= 0 {
		s.finish(sp, p, o)
		return
	}
	sp.terminating, sp.stopped, sp.due = true, o, sp.at().Add(term)
}

// at is when the event the kubelet plays now happened: the end of the pod's wait, where one
// has ended (the harness notices it a step's real time later, which Argo would count), else now.
func (sp *simPod) at() metav1.Time {
	if !sp.due.IsZero() && !sp.due.After(time.Now()) {
		return metav1.NewTime(sp.due)
	}
	return metav1.Now()
}

// left is how long the pod's current wait has to run (zero or less: due).
func (sp *simPod) left() time.Duration {
	if sp.due.IsZero() {
		return 0
	}
	return time.Until(sp.due)
}

// awaitPodInformer waits until the pod informer (which Argo's test controller runs for real)
// has seen every deletion of this run's pods, so the next operate() reads what the API holds.
func (s *simulator) awaitPodInformer() {
	live := map[string]bool{}
	for _, p := range s.listPods() {
		live[p.Name] = true
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		stale := false
		for _, obj := range s.c.PodController.TestingPodInformer().GetStore().List() {
			if p, ok := obj.(*apiv1.Pod); ok && p.Labels[common.LabelKeyWorkflow] == s.wf.Name && !live[p.Name] {
				stale = true
				break
			}
		}
		if !stale {
			return
		}
		if time.Now().After(deadline) {
			s.fatalf("pod informer did not see the controller's pod deletions within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

func mainContainerStatus(p *apiv1.Pod, state apiv1.ContainerState) {
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		st := apiv1.ContainerStatus{Name: c.Name, State: state}
		if c.Name != common.MainContainerName {
			// The wait container ends cleanly in every outcome we simulate.
			if state.Terminated != nil {
				st.State = apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}
			} else {
				st.State = apiv1.ContainerState{Running: &apiv1.ContainerStateRunning{}}
			}
		}
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, st)
	}
}

// templateOutputDefaults gives the output parameters of the pod's template that have a default,
// as the controller resolved them for this pod (ARGO_TEMPLATE, which the executor reads): with
// no file written (nothing runs here), the wait container reports exactly these, whatever
// main's exit code was (PostMain runs SaveParameters for a failed main too).
func templateOutputDefaults(p *apiv1.Pod) map[string]string {
	defaults := map[string]string{}
	for _, c := range append(append([]apiv1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		for _, e := range c.Env {
			if e.Name != common.EnvVarTemplate {
				continue
			}
			var tmpl wfv1.Template
			if err := json.Unmarshal([]byte(e.Value), &tmpl); err != nil {
				continue
			}
			for _, param := range tmpl.Outputs.Parameters {
				if param.ValueFrom != nil && param.ValueFrom.Default != nil {
					defaults[param.Name] = param.ValueFrom.Default.String()
				}
			}
			return defaults
		}
	}
	return defaults
}

// publishOutputs writes the pod's WorkflowTaskResult as the wait container does: the
// scenario's outputs, and each declared default the scenario does not override.
func (s *simulator) publishOutputs(sp *simPod, p *apiv1.Pod, o simOutcome, phase wfv1.NodePhase) {
	given := templateOutputDefaults(p)
	for k, v := range o.Outputs {
		given[k] = v
	}
	if phase != wfv1.NodeSucceeded && len(given) == 0 {
		return // a failed main with nothing to report: the executor's result holds nothing
	}
	o.Outputs = given
	outputs := wfv1.Outputs{}
	names := make([]string, 0, len(o.Outputs))
	for k := range o.Outputs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		outputs.Parameters = append(outputs.Parameters, wfv1.Parameter{Name: k, Value: wfv1.AnyStringPtr(o.Outputs[k])})
	}
	outputs.Result = o.Result
	tr := &wfv1.WorkflowTaskResult{
		TypeMeta: metav1.TypeMeta{APIVersion: workflow.APIVersion, Kind: workflow.WorkflowTaskResultKind},
		ObjectMeta: metav1.ObjectMeta{
			Name:      sp.nodeID,
			Namespace: s.wf.Namespace,
			Labels: map[string]string{
				common.LabelKeyWorkflow:               s.wf.Name,
				common.LabelKeyReportOutputsCompleted: "true",
			},
		},
		NodeResult: wfv1.NodeResult{Phase: phase, Outputs: &outputs},
	}
	s.stamp(&tr.ObjectMeta)
	s.unsyncedResults[tr.Name] = true
	results := s.c.wfclientset.ArgoprojV1alpha1().WorkflowTaskResults(s.wf.Namespace)
	_, err := results.Create(s.ctx, tr, metav1.CreateOptions{})
	if apierr.IsAlreadyExists(err) { // the pod was re-created under the same node
		_, err = results.Update(s.ctx, tr, metav1.UpdateOptions{})
	}
	if err != nil {
		s.fatalf("task result: %v", err)
	}
}

// publishUnlessLost writes a failed pod's task result unless the scenario says the executor
// could not.
func (s *simulator) publishUnlessLost(sp *simPod, p *apiv1.Pod, o simOutcome) {
	if !o.NoResult {
		s.publishOutputs(sp, p, o, wfv1.NodeFailed)
	}
}

// waitFailedIf ends the wait container with exit 1: it could not report main's outputs.
func waitFailedIf(p *apiv1.Pod, failed bool) {
	if !failed {
		return
	}
	for i := range p.Status.ContainerStatuses {
		if st := &p.Status.ContainerStatuses[i]; st.Name == common.WaitContainerName {
			st.State = apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}
		}
	}
}

// finish applies a terminal outcome to a running pod.
func (s *simulator) finish(sp *simPod, p *apiv1.Pod, o simOutcome) {
	now := sp.at()
	switch o.Outcome {
	case "succeeded":
		s.publishOutputs(sp, p, o, wfv1.NodeSucceeded)
		p.Status.Phase = apiv1.PodSucceeded
		mainContainerStatus(p, apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: now}})
	case "failed":
		code := int32(1)
		if o.ExitCode != nil {
			code = *o.ExitCode
		}
		s.publishUnlessLost(sp, p, o)
		p.Status.Phase = apiv1.PodFailed
		mainContainerStatus(p, apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: code, Reason: "Error", Message: o.Message, FinishedAt: now}})
		waitFailedIf(p, o.NoResult)
	case "oomkilled":
		s.publishUnlessLost(sp, p, o)
		p.Status.Phase = apiv1.PodFailed
		mainContainerStatus(p, apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled", Message: o.Message, FinishedAt: now}})
		waitFailedIf(p, o.NoResult)
	case "disrupted":
		// Scheduler preemption or API eviction: Kubernetes adds the DisruptionTarget
		// condition and SIGTERMs the containers; the pod carries no message of its own, so
		// what Argo sees is main's exit code (143) and its termination message.
		code := int32(143)
		if o.ExitCode != nil {
			code = *o.ExitCode
		}
		p.Status.Phase = apiv1.PodFailed
		p.Status.Conditions = append(p.Status.Conditions, apiv1.PodCondition{
			Type: apiv1.DisruptionTarget, Status: apiv1.ConditionTrue, Reason: "PreemptionByScheduler",
			Message: "Kubernetes scheduler preempted the pod", LastTransitionTime: now,
		})
		mainContainerStatus(p, apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: code, Reason: "Error", Message: o.Message, FinishedAt: now}})
	case "shutdown":
		// Graceful node shutdown (spot reclaim): kubelet's exact pod status.
		p.Status.Phase = apiv1.PodFailed
		p.Status.Reason = "Terminated"
		p.Status.Message = "Pod was terminated in response to imminent node shutdown."
		p.Status.Conditions = append(p.Status.Conditions, apiv1.PodCondition{
			Type: apiv1.DisruptionTarget, Status: apiv1.ConditionTrue, Reason: "TerminationByKubelet",
			Message: "Pod was terminated in response to imminent node shutdown.", LastTransitionTime: now,
		})
		mainContainerStatus(p, apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: 143, Reason: "Error", FinishedAt: now}})
	case "lost":
		// The node went away at once (kubelet and containerd killed, the Node deleted): no
		// container reports again and no task result is written. Pod GC then marks the
		// orphaned pod Failed as it stands (v1.35 gcOrphaned: phase and DisruptionTarget
		// only) and deletes it, which the harness does at the next step.
		p.Status.Phase = apiv1.PodFailed
		p.Status.Conditions = append(p.Status.Conditions, apiv1.PodCondition{
			Type: apiv1.DisruptionTarget, Status: apiv1.ConditionTrue, Reason: "DeletionByPodGC",
			Message: "PodGC: node no longer exists", LastTransitionTime: now,
		})
		for i := range p.Status.ContainerStatuses {
			st := &p.Status.ContainerStatuses[i]
			st.State = apiv1.ContainerState{Running: &apiv1.ContainerStateRunning{StartedAt: now}}
			if st.Name == common.MainContainerName && o.ExitCode != nil {
				reason := "Error"
				if *o.ExitCode == 137 {
					reason = "OOMKilled"
				}
				st.State = apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: *o.ExitCode, Reason: reason, Message: o.Message, FinishedAt: now}}
			}
		}
		sp.stage = 3
		s.updatePod(p)
		return
	case "deadline":
		s.publishOutputs(sp, p, o, wfv1.NodeFailed) // the wait container saves them after SIGTERM too
		p.Status.Phase = apiv1.PodFailed
		p.Status.Reason = deadlineReason
		p.Status.Message = deadlineMessage
		mainContainerStatus(p, apiv1.ContainerState{Terminated: &apiv1.ContainerStateTerminated{ExitCode: *o.ExitCode, Reason: "Error", Message: o.Message, FinishedAt: now}})
	case "deleted":
		// The node vanished (or someone deleted the pod): the pod object is gone.
		podcs := s.c.kubeclientset.CoreV1().Pods(s.wf.Namespace)
		if err := podcs.Delete(s.ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			s.fatalf("delete pod: %v", err)
		}
		s.unsyncedPods[p.Name] = true
		sp.deleted = true
		sp.stage = 2
		return
	default:
		s.fatalf("unknown outcome %q", o.Outcome)
	}
	sp.stage = 2
	s.updatePod(p)
}

// kubelet advances every pod one stage. It reports whether anything changed, the shortest
// simulated wait that a pod still has (run time, pending time or time to its deadline), and
// whether that wait ends at a pod's activeDeadlineSeconds.
func (s *simulator) kubelet() (changed bool, wait time.Duration, deadlineDue bool) {
	pods := s.listPods()
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	var nearestDeadline time.Duration
	listed := map[string]bool{}
	for i := range pods {
		listed[pods[i].Name] = true
	}
	for name, sp := range s.pods {
		// Gone without the kubelet's doing: the controller deleted it (pendingTimeout, pod GC).
		if !listed[name] && !sp.deleted {
			sp.deleted, sp.deletedByController, sp.stage = true, sp.stage < 2, 2
		}
	}
	for i := range pods {
		p := &pods[i]
		sp, seen := s.pods[p.Name]
		// A deleted pod that is back was re-created by the controller under the same name:
		// a new pod, which takes the next outcome.
		if !seen || sp.deleted {
			nodeID := p.Annotations[common.AnnotationKeyNodeID]
			if nodeID == "" {
				nodeID = s.wf.NodeID(p.Annotations[common.AnnotationKeyNodeName])
			}
			node, err := s.wf.Status.Nodes.Get(nodeID)
			if err != nil {
				s.fatalf("pod %s has no node: %v", p.Name, err)
			}
			key := s.keyOf(node)
			o := simOutcome{Outcome: "succeeded"}
			from := key
			if _, listed := s.queues[key]; !listed {
				from = "*"
			}
			if q := s.queues[from]; len(q) > 0 {
				o, s.queues[from] = q[0], q[1:]
			}
			s.podsPerNode[nodeID]++
			sp = &simPod{name: p.Name, nodeID: nodeID, key: key, outcome: o, order: s.created}
			s.created++
			s.pods[p.Name] = sp
		}
		if sp.stage == 3 {
			// The lost node's pod, marked Failed by pod GC at the last step, is deleted now.
			podcs := s.c.kubeclientset.CoreV1().Pods(s.wf.Namespace)
			if err := podcs.Delete(s.ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				s.fatalf("delete pod: %v", err)
			}
			s.unsyncedPods[p.Name] = true
			sp.deleted, sp.stage, changed = true, 2, true
			continue
		}
		if sp.stage == 2 {
			continue
		}
		o := sp.outcome
		switch sp.stage {
		case 0:
			now := metav1.Now()
			// A pod bound (or found unschedulable) at once starts, on the controller's clock,
			// when it was created: the real seconds the controller and the informers take
			// before the harness gets here (many on a loaded machine) would otherwise count
			// against its activeDeadlineSeconds and the workflow's deadline but not its
			// outcome, and a pod due a second before its deadline would miss it.
			start := sp.at() // after a pending spell: when the spell ended
			if !sp.pended && !p.CreationTimestamp.IsZero() {
				start = p.CreationTimestamp
			}
			sp.due = start.Add(time.Duration(o.Minutes * float64(time.Minute)))
			if o.Outcome == "pending" || o.Outcome == "deleted-pending" {
				p.Status.Phase = apiv1.PodPending
				p.Status.Conditions = []apiv1.PodCondition{{
					Type: apiv1.PodScheduled, Status: apiv1.ConditionFalse, Reason: apiv1.PodReasonUnschedulable,
					Message: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", LastTransitionTime: now,
				}}
			} else {
				// Scheduled: bound to a node (Argo reports it as the node's hostNodeName).
				p.Spec.NodeName = simNodeName
				p.Status.Phase = apiv1.PodRunning
				p.Status.StartTime = &start
				p.Status.Conditions = []apiv1.PodCondition{{Type: apiv1.PodScheduled, Status: apiv1.ConditionTrue, LastTransitionTime: now}}
				mainContainerStatus(p, apiv1.ContainerState{Running: &apiv1.ContainerStateRunning{StartedAt: start}})
			}
			sp.stage = 1
			s.updatePod(p)
			changed = true
		case 1:
			waitLeft := sp.left()
			if sp.terminating {
				// Inside the grace period: the deadline no longer applies (the kill is under
				// way); the pod ends when main exits.
				if waitLeft > 0 {
					if wait == 0 || waitLeft < wait {
						wait = waitLeft
					}
					continue
				}
				sp.terminating = false
				s.finish(sp, p, sp.stopped)
				changed = true
				continue
			}
			if left, ok := deadlineLeft(p); ok && p.Status.Phase == apiv1.PodRunning {
				if left <= 0 {
					s.exceedDeadline(sp, p)
					changed = true
					continue
				}
				if waitLeft > 0 {
					if wait == 0 || left < wait {
						wait = left // the clock stops at the deadline, as it does at a pod's end
					}
					if nearestDeadline == 0 || left < nearestDeadline {
						nearestDeadline = left
					}
				}
			}
			if waitLeft > 0 {
				if wait == 0 || waitLeft < wait {
					wait = waitLeft
				}
				continue
			}
			if o.Outcome == "deleted-pending" {
				// Deleted before it ever ran (spot capacity reclaimed while unschedulable).
				s.finish(sp, p, simOutcome{Outcome: "deleted"})
				changed = true
				continue
			}
			if o.Outcome == "pending" {
				if o.Then == nil {
					continue // unschedulable for ever
				}
				// Scheduled at last: start over with the follow-up outcome.
				sp.outcome = *o.Then
				sp.stage, sp.pended = 0, true
				changed = true
				continue
			}
			if o.Outcome == "disrupted" {
				s.stop(sp, p, o) // the disruption's SIGTERM: main may take its grace
			} else {
				s.finish(sp, p, o)
			}
			changed = true
		}
	}
	return changed, wait, nearestDeadline > 0 && wait == nearestDeadline
}

// spend lets simulated time pass for every waiting pod.
func (s *simulator) spend(d time.Duration) {
	for _, sp := range s.pods {
		if !sp.due.IsZero() {
			sp.due = sp.due.Add(-d)
		}
	}
	s.advance(d)
}

func (s *simulator) report() runReport {
	end := s.wf.Status.FinishedAt
	if end.IsZero() {
		end = metav1.Now()
	}
	simMinutes := s.elapsed.Minutes()
	if m := minutesSince(s.wf.Status.StartedAt, end); m != nil {
		simMinutes = *m
	}
	r := runReport{Workflow: s.wf.Name, Phase: string(s.wf.Status.Phase), Message: s.wf.Status.Message,
		Steps: s.steps, SimMinutes: simMinutes,
		PodPatches: controllerPodPatches.Load() - s.patchesAtStart, OperateSeconds: s.operateTime.Seconds()}
	byNode := map[string]*simPod{}
	for _, sp := range s.pods {
		byNode[sp.nodeID] = sp
	}
	podcs := s.c.kubeclientset.CoreV1().Pods(s.wf.Namespace)
	ids := make([]string, 0, len(s.wf.Status.Nodes))
	for id := range s.wf.Status.Nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var attempts []nodeReport
	var order []int
	for _, id := range ids {
		n := s.wf.Status.Nodes[id]
		_, attempt := nodeKey(n.DisplayName)
		nr := nodeReport{ID: id, Name: n.Name, DisplayName: n.DisplayName, Key: s.keyOf(&n), Attempt: attempt,
			Type: string(n.Type), Template: n.TemplateName, Phase: string(n.Phase), Message: n.Message,
			Memoization: n.MemoizationStatus, Children: n.Children,
			StartedMinute: minutesSince(s.wf.Status.StartedAt, n.StartedAt), FinishedMinute: minutesSince(s.wf.Status.StartedAt, n.FinishedAt)}
		if n.Outputs != nil {
			if n.Outputs.ExitCode != nil {
				nr.ExitCode = *n.Outputs.ExitCode
			}
			for _, p := range n.Outputs.Parameters {
				if nr.Outputs == nil {
					nr.Outputs = map[string]string{}
				}
				if p.Value != nil {
					nr.Outputs[p.Name] = p.Value.String()
				}
			}
		}
		if sp := byNode[id]; sp != nil {
			nr.Outcome = sp.outcome.Outcome
			nr.PodsCreated = s.podsPerNode[id]
			pr := &podReport{Name: sp.name, Deleted: sp.deleted, DeletedByController: sp.deletedByController,
				Signalled: sp.signalled, DeadlineExceeded: sp.deadlineExceeded}
			pod, err := podcs.Get(s.ctx, sp.name, metav1.GetOptions{})
			if err == nil {
				describePod(pod, pr)
			} else if snap, ok := s.podSnapshots[sp.name]; ok {
				describePod(snap, pr)
			}
			nr.Pod = pr
		}
		r.Nodes = append(r.Nodes, nr)
		if n.Type == wfv1.NodeTypePod {
			attempts = append(attempts, nr)
			o := 1 << 30
			if sp := byNode[id]; sp != nil {
				o = sp.order
			}
			order = append(order, o)
		}
	}
	idx := make([]int, len(attempts))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return order[idx[a]] < order[idx[b]] })
	for _, i := range idx {
		r.Attempts = append(r.Attempts, attempts[i])
	}
	return r
}

func describePod(pod *apiv1.Pod, pr *podReport) {
	pr.FinalPhase = string(pod.Status.Phase)
	pr.Reason = pod.Status.Reason
	pr.Message = pod.Status.Message
	pr.NodeSelector = pod.Spec.NodeSelector
	pr.Tolerations = pod.Spec.Tolerations
	pr.Affinity = pod.Spec.Affinity
	pr.ActiveDeadlineSeconds = pod.Spec.ActiveDeadlineSeconds
	for _, c := range pod.Spec.Containers {
		if c.Name != common.MainContainerName {
			continue
		}
		if q, ok := c.Resources.Limits[apiv1.ResourceMemory]; ok {
			pr.MemoryLimit = q.String()
		}
		if q, ok := c.Resources.Requests[apiv1.ResourceMemory]; ok {
			pr.MemoryRequest = q.String()
		}
		for name, q := range c.Resources.Limits {
			if pr.Limits == nil {
				pr.Limits = map[string]string{}
			}
			pr.Limits[string(name)] = q.String()
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "ARGO_") {
				continue // executor plumbing, not what the compiler set
			}
			if pr.Env == nil {
				pr.Env = map[string]string{}
			}
			pr.Env[e.Name] = e.Value
		}
		pr.Args = c.Args
	}
}

// podSnapshots keeps deleted pods' specs so that the report still shows what they got.
func (s *simulator) snapshotPods() {
	for _, p := range s.listPods() {
		s.podSnapshots[p.Name] = p.DeepCopy()
	}
}

func decodeWorkflow(raw json.RawMessage) (*wfv1.Workflow, error) {
	var wf wfv1.Workflow
	if err := yaml.UnmarshalStrict(raw, &wf); err != nil {
		return nil, err
	}
	return &wf, nil
}

func TestArgoSim(t *testing.T) {
	in, out := os.Getenv("ARGOSIM_IN"), os.Getenv("ARGOSIM_OUT")
	if in == "" || out == "" {
		t.Skip("ARGOSIM_IN/ARGOSIM_OUT not set: run through tests/argo/argo_tools.py")
	}
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	var sc simScenario
	if err := json.Unmarshal(data, &sc); err != nil {
		t.Fatalf("scenario: %v", err)
	}
	rep := simReport{Scenario: sc.Name}
	defer func() {
		if rep.Error == "" && t.Failed() {
			rep.Error = "harness: " + simFatal
		}
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Error(err)
		}
	}()
	base, err := decodeWorkflow(sc.Workflow)
	if err != nil {
		rep.Error = "workflow: " + err.Error()
		t.Fatal(rep.Error)
	}
	if base.Namespace == "" {
		base.Namespace = "default"
	}
	opts := []any{defaultServiceAccount, func(wfc *WorkflowController) {
		// Argo's test recorder buffers 64 events and then blocks the controller; a large
		// workflow emits far more. A FakeRecorder without a channel drops them.
		wfc.eventRecorderManager = &testEventRecorderManager{eventRecorder: &record.FakeRecorder{}}
		// Argo's constructor uses client-go's field-managed fake, which builds a REST mapper
		// and managed fields on every write: 0.3 s a step at 30 stages, so large workflows
		// never finish. Managed fields mean nothing to the controller; the plain object
		// tracker holds the same objects. Everything that keeps a client gets this one.
		kube := fake.NewSimpleClientset(defaultServiceAccount)
		kube.PrependWatchReactor("pods", selectingWatchReactor(kube))
		kube.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			controllerPodPatches.Add(1)
			return false, nil, nil
		})
		wfc.kubeclientset = kube
		wfc.cacheFactory = controllercache.NewCacheFactory(kube, "default")
	}}
	for _, raw := range sc.WorkflowTemplates {
		var tmpl wfv1.WorkflowTemplate
		if err := yaml.UnmarshalStrict(raw, &tmpl); err != nil {
			rep.Error = "workflowTemplate: " + err.Error()
			t.Fatal(rep.Error)
		}
		if tmpl.Namespace == "" {
			tmpl.Namespace = base.Namespace
		}
		opts = append(opts, runtime.Object(&tmpl))
	}
	// client-go's fake watch holds 100 events and panics when one more arrives before its
	// informer has read them; a step of a 2,000-pod workflow writes thousands. A real watch
	// has no such limit, so give the fake one room.
	watch.DefaultChanSize = 1 << 17
	ctx := logging.TestContext(context.Background())
	cancel, c := newController(ctx, opts...)
	defer cancel()
	c.PodController.ArgosimImmediateCleanupQueue()
	// The API server defaults a new pod's phase to Pending. The fake clientset does not, and
	// the informer may deliver the creation event after the simulated kubelet's first update;
	// the controller then saw phase "" and failed the node ("Unexpected pod phase").
	fc, ok := c.kubeclientset.(*fake.Clientset)
	if !ok {
		panic(fmt.Sprintf("argo-sim: expected Argo's fake clientset, got %T", c.kubeclientset))
	}
	{
		fc.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
			if create, ok := action.(k8stesting.CreateAction); ok {
				if pod, ok := create.GetObject().(*apiv1.Pod); ok {
					if pod.Status.Phase == "" {
						pod.Status.Phase = apiv1.PodPending
					}
					// The API server stamps every new object; the harness's kubelet starts
					// a pod bound at once from this moment.
					if pod.CreationTimestamp.IsZero() {
						pod.CreationTimestamp = metav1.Now()
					}
				}
			}
			return false, nil, nil
		})
	}
	maxSteps := sc.MaxSteps
	if maxSteps == 0 {
		maxSteps = 400
	}
	if len(sc.Runs) == 0 {
		sc.Runs = []simRun{{}}
	}
	for i, run := range sc.Runs {
		wf := base.DeepCopy()
		if wf.Name == "" {
			wf.Name = strings.TrimSuffix(wf.GenerateName, "-")
			if wf.Name == "" {
				wf.Name = "sim"
			}
		}
		wf.Name = fmt.Sprintf("%s-run%d", wf.Name, i)
		wf.GenerateName = ""
		for j, p := range wf.Spec.Arguments.Parameters {
			if v, ok := run.Parameters[p.Name]; ok {
				wf.Spec.Arguments.Parameters[j].Value = wfv1.AnyStringPtr(v)
			}
		}
		wf, err = c.wfclientset.ArgoprojV1alpha1().Workflows(wf.Namespace).Create(ctx, wf, metav1.CreateOptions{})
		if err != nil {
			rep.Error = err.Error()
			t.Fatal(err)
		}
		queues := map[string][]simOutcome{}
		for k, v := range run.Attempts {
			queues[k] = append([]simOutcome(nil), v...)
		}
		s := &simulator{t: t, ctx: ctx, c: c, wf: wf, pods: map[string]*simPod{}, queues: queues,
			podSnapshots: map[string]*apiv1.Pod{}, podsPerNode: map[string]int{},
			unsyncedPods: map[string]bool{}, unsyncedResults: map[string]bool{},
			patchesAtStart: controllerPodPatches.Load()}
		s.runWithSnapshots(maxSteps)
		r := s.report()
		if sc.RecordWorkflow {
			r.Object = s.wf.DeepCopy()
		}
		rep.Runs = append(rep.Runs, r)
	}
}

func (s *simulator) runWithSnapshots(maxSteps int) {
	s.operate()
	s.snapshotPods()
	for s.steps < maxSteps && !s.wf.Status.Fulfilled() {
		changed, wait, deadlineDue := s.kubelet()
		s.snapshotPods()
		if !changed {
			// Let time pass in ticks, never more than one at a time, up to the next pod event:
			// the controller's own deadlines (workflow and template deadlines, pendingTimeout,
			// backoff, the pod-missing grace) are invisible here, and a jump straight to the next
			// pod event would skip over every one of them that falls in between.
			d := tick
			if wait > 0 && wait < d {
				d = wait
			}
			s.spend(d)
			if deadlineDue && d == wait {
				// The clock stands at a pod's activeDeadlineSeconds: the kubelet stops it now,
				// before the controller looks. Otherwise the real time this step takes would
				// decide whether the controller's own deadline, which Argo sets to fall less
				// than a second later, is seen first.
				continue
			}
		} else {
			s.spend(time.Second)
		}
		s.operate()
		s.snapshotPods()
	}
}

// selectingWatchReactor gives the fake clientset's pod watch the API server's label-selector
// semantics. client-go's object tracker ignores a watch's selector, so Argo's pod informer
// (which watches `workflows.argoproj.io/completed=false` only) kept every completed pod, and each
// reconciliation queued and patched every one of them again: quadratic in a chain's length. The
// API server instead sends ADDED when an object starts to match and DELETED when it stops.
func selectingWatchReactor(kube *fake.Clientset) k8stesting.WatchReactionFunc {
	return func(action k8stesting.Action) (bool, watch.Interface, error) {
		wa, ok := action.(k8stesting.WatchAction)
		if !ok {
			return false, nil, nil
		}
		sel := wa.GetWatchRestrictions().Labels
		if sel == nil || sel.Empty() {
			return false, nil, nil
		}
		watchedPods.Store(&sel)
		inner, err := kube.Tracker().Watch(action.GetResource(), action.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		// What already matches was listed by the informer before it watched: an object that
		// stops matching later must still produce its DELETED.
		matched := map[string]bool{}
		listed, err := kube.Tracker().List(action.GetResource(), apiv1.SchemeGroupVersion.WithKind("Pod"), action.GetNamespace())
		if err != nil {
			inner.Stop()
			return true, nil, err
		}
		if pods, ok := listed.(*apiv1.PodList); ok {
			for _, p := range pods.Items {
				if sel.Matches(labels.Set(p.Labels)) {
					matched[p.Namespace+"/"+p.Name] = true
				}
			}
		}
		out := make(chan watch.Event, watch.DefaultChanSize)
		lag := watchLag()
		go func() {
			defer close(out)
			for ev := range inner.ResultChan() {
				if lag > 0 {
					time.Sleep(lag)
				}
				obj, isMeta := ev.Object.(metav1.Object)
				if !isMeta || (ev.Type != watch.Added && ev.Type != watch.Modified && ev.Type != watch.Deleted) {
					out <- ev
					continue
				}
				key := obj.GetNamespace() + "/" + obj.GetName()
				was, now := matched[key], sel.Matches(labels.Set(obj.GetLabels()))
				switch {
				case ev.Type == watch.Deleted:
					if was {
						out <- ev
					}
					delete(matched, key)
				case now && was:
					out <- ev
				case now:
					matched[key] = true
					out <- watch.Event{Type: watch.Added, Object: ev.Object}
				case was:
					delete(matched, key)
					out <- watch.Event{Type: watch.Deleted, Object: ev.Object}
				}
			}
		}()
		return true, &selectedWatch{inner: inner, out: out}, nil
	}
}

// watchLag delays every pod event the informer receives by ARGOSIM_WATCH_LAG (a Go duration):
// a loaded machine's informer goroutine, made reproducible, so that a test can show the
// scenarios do not depend on how soon the informer catches up.
func watchLag() time.Duration {
	v := os.Getenv("ARGOSIM_WATCH_LAG")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		panic(fmt.Sprintf("argo-sim: ARGOSIM_WATCH_LAG=%q: %v", v, err))
	}
	return d
}

// watchedPods is the label selector of the pod informer's watch (Argo's pod controller asks
// for incomplete workflow pods only), as the reactor last received it.
var watchedPods atomic.Pointer[labels.Selector]

func podWatchSelector() labels.Selector {
	sel := watchedPods.Load()
	if sel == nil {
		return labels.Everything() // not watching yet: its first list will hold everything
	}
	return *sel
}

type selectedWatch struct {
	inner watch.Interface
	out   chan watch.Event
}

func (w *selectedWatch) Stop()                          { w.inner.Stop() }
func (w *selectedWatch) ResultChan() <-chan watch.Event { return w.out }
