// Package pod: this file is NOT part of Argo. durapipe adds it to Argo's workflow/controller/pod
// package at build time with `go test -overlay` (see docs/argo-harness.md), for the harness only.
//
// Argo's in-package test constructor starts the pod controller with zero cleanup workers, so
// nothing the controller queues for a pod (delete a Pending pod whose pendingTimeout expired,
// label a completed pod, pod GC, stop a pod past its deadline) ever happens. A real controller
// has workers. The harness steps the controller synchronously, so it runs the worker's own
// function between steps instead, on a queue whose rate limiter releases every item at once (a
// real one waits milliseconds to seconds, which the simulated clock cannot move).
package pod

import (
	"context"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
)

// ArgosimSignal is a signal the controller sends into a pod's containers. A real controller
// does that by exec through the API server, which a fake clientset cannot serve, so the harness
// plays the kubelet's part instead.
type ArgosimSignal struct {
	Namespace string
	Pod       string
	Kill      bool // SIGKILL (after the grace period) rather than SIGTERM
}

// ArgosimImmediateCleanupQueue replaces the cleanup queue with one that never delays an item.
// Call it before the first workflow is operated on.
func (c *Controller) ArgosimImmediateCleanupQueue() {
	c.workqueue.ShutDown()
	c.workqueue = workqueue.NewTypedRateLimitingQueue[string](
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](0, 0))
}

// ArgosimDrainCleanup runs the cleanup worker until the queue is empty. It returns how many
// items the worker processed and the signals it was asked to send, which it leaves to the
// caller.
func (c *Controller) ArgosimDrainCleanup(ctx context.Context) (int, []ArgosimSignal) {
	processed := 0
	var signals []ArgosimSignal
	// Bounded: a worker that fails an item re-queues it, and a broken harness must not spin.
	for round := 0; c.workqueue.Len() > 0 && round < 100; round++ {
		var work []string
		for n := c.workqueue.Len(); n > 0; n-- {
			key, _ := c.workqueue.Get()
			c.workqueue.Done(key)
			namespace, podName, action, _ := parsePodCleanupKey(key)
			switch action {
			case terminateContainers:
				c.workqueue.Forget(key)
				// As processNextPodCleanupItem does: a Pending pod is deleted, not signalled.
				if pod, err := c.GetPod(namespace, podName); err == nil && pod != nil && pod.Status.Phase == apiv1.PodPending {
					c.queuePodForCleanup(ctx, namespace, podName, deletePod)
				} else {
					signals = append(signals, ArgosimSignal{Namespace: namespace, Pod: podName})
				}
			case killContainers:
				c.workqueue.Forget(key)
				signals = append(signals, ArgosimSignal{Namespace: namespace, Pod: podName, Kill: true})
			default:
				work = append(work, key)
			}
		}
		for _, key := range work {
			c.workqueue.Add(key)
		}
		for range work {
			c.processNextPodCleanupItem(ctx)
			processed++
		}
	}
	return processed, signals
}
