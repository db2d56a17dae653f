package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// AdmissionState is the guard's process-wide admission, as metrics and
// the /clients page show it.
type AdmissionState struct {
	// ItemLimit is the adaptive in-flight item limit now, between
	// MinItemLimit and MaxItemLimit (min_inflight_items,
	// max_inflight_items).
	ItemLimit    int64 `json:"item_limit"`
	MinItemLimit int64 `json:"min_item_limit"`
	MaxItemLimit int64 `json:"max_item_limit"`
	// ItemsInUse are the items admitted and not yet finished.
	ItemsInUse int64 `json:"items_in_use"`
	// Waiting are the requests queued for item capacity; Shed counts the
	// requests the queue has shed since start.
	Waiting int   `json:"waiting"`
	Shed    int64 `json:"shed"`
	// Light counts the requests of callers under their fair share
	// admitted within light_reserve_items, past the queue or next in
	// line before the other waiters, since start.
	Light int64 `json:"light"`
	// RequestSlots is max_inflight_requests; SlotsInUse of them are
	// taken, SlotsWaiting requests wait for one, and SlotsShed counts
	// the requests shed for want of one since start.
	RequestSlots int64 `json:"request_slots"`
	SlotsInUse   int64 `json:"request_slots_in_use"`
	SlotsWaiting int   `json:"request_slots_waiting"`
	SlotsShed    int64 `json:"request_slots_shed"`
}

// admissionMetric is one number of AdmissionState as an observable
// instrument: a gauge, or a counter for the totals since start.
type admissionMetric struct {
	name, desc string
	counter    bool
	value      func(AdmissionState) int64
}

// admissionMetrics are the instruments ObserveAdmission exports.
var admissionMetrics = []admissionMetric{
	{"sluice.guard.items.limit", "The adaptive process-wide limit on items in flight now.", false, func(s AdmissionState) int64 { return s.ItemLimit }},
	{"sluice.guard.items.limit_min", "The lower bound of the adaptive item limit (min_inflight_items).", false, func(s AdmissionState) int64 { return s.MinItemLimit }},
	{"sluice.guard.items.limit_max", "The upper bound of the adaptive item limit (max_inflight_items).", false, func(s AdmissionState) int64 { return s.MaxItemLimit }},
	{"sluice.guard.items.in_flight", "Items admitted and not yet finished.", false, func(s AdmissionState) int64 { return s.ItemsInUse }},
	{"sluice.guard.queue.waiting", "Requests waiting for item capacity.", false, func(s AdmissionState) int64 { return int64(s.Waiting) }},
	{"sluice.guard.queue.shed", "Requests the item queue shed (Unavailable with RetryInfo) since start.", true, func(s AdmissionState) int64 { return s.Shed }},
	{"sluice.guard.queue.light", "Requests of callers under their fair share admitted within light_reserve_items, past waiting requests or next in line before them, since start.", true, func(s AdmissionState) int64 { return s.Light }},
	{"sluice.guard.request_slots.limit", "Request slots (max_inflight_requests).", false, func(s AdmissionState) int64 { return s.RequestSlots }},
	{"sluice.guard.request_slots.in_use", "Request slots taken, of max_inflight_requests.", false, func(s AdmissionState) int64 { return s.SlotsInUse }},
	{"sluice.guard.request_slots.waiting", "Requests waiting for a request slot.", false, func(s AdmissionState) int64 { return int64(s.SlotsWaiting) }},
	{"sluice.guard.request_slots.shed", "Requests shed (Unavailable with RetryInfo) for want of a request slot since start.", true, func(s AdmissionState) int64 { return s.SlotsShed }},
}

// ObserveAdmission exports the guard's admission state (admissionMetrics):
// the adaptive item limit and its bounds, items in use, requests waiting,
// requests shed, requests admitted within the light reserve, and the request slots
// taken, waited for and shed. It also hands state to the /clients page.
func (t *Telemetry) ObserveAdmission(state func() AdmissionState) error {
	instruments := make([]metric.Int64Observable, len(admissionMetrics))
	for i, am := range admissionMetrics {
		var err error
		if am.counter {
			instruments[i], err = t.meter.Int64ObservableCounter(am.name, metric.WithDescription(am.desc))
		} else {
			instruments[i], err = t.meter.Int64ObservableGauge(am.name, metric.WithDescription(am.desc))
		}
		if err != nil {
			return err
		}
	}
	observables := make([]metric.Observable, len(instruments))
	for i, in := range instruments {
		observables[i] = in
	}
	t.stats.setAdmission(state)
	_, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := state()
		for i, am := range admissionMetrics {
			o.ObserveInt64(instruments[i], am.value(s))
		}
		return nil
	}, observables...)
	return err
}
