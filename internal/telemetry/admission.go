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
	// admitted past the queue, within light_reserve_items, since start.
	Light int64 `json:"light"`
	// RequestSlots is max_inflight_requests; SlotsInUse of them are
	// taken, SlotsWaiting requests wait for one, and SlotsShed counts
	// the requests shed for want of one since start.
	RequestSlots int64 `json:"request_slots"`
	SlotsInUse   int64 `json:"request_slots_in_use"`
	SlotsWaiting int   `json:"request_slots_waiting"`
	SlotsShed    int64 `json:"request_slots_shed"`
}

// ObserveAdmission exports the guard's admission state: the adaptive item
// limit and its bounds, items in use, requests waiting, requests shed,
// requests admitted past the queue, and the request slots taken, waited
// for and shed. It also hands state to the /clients page.
func (t *Telemetry) ObserveAdmission(state func() AdmissionState) error {
	m := t.meter
	gauge := func(name, desc string) (metric.Int64ObservableGauge, error) {
		return m.Int64ObservableGauge(name, metric.WithDescription(desc))
	}
	limit, err := gauge("sluice.guard.items.limit", "The adaptive process-wide limit on items in flight now.")
	if err != nil {
		return err
	}
	minLimit, err := gauge("sluice.guard.items.limit_min", "The lower bound of the adaptive item limit (min_inflight_items).")
	if err != nil {
		return err
	}
	maxLimit, err := gauge("sluice.guard.items.limit_max", "The upper bound of the adaptive item limit (max_inflight_items).")
	if err != nil {
		return err
	}
	inUse, err := gauge("sluice.guard.items.in_flight", "Items admitted and not yet finished.")
	if err != nil {
		return err
	}
	waiting, err := gauge("sluice.guard.queue.waiting", "Requests waiting for item capacity.")
	if err != nil {
		return err
	}
	shed, err := m.Int64ObservableCounter("sluice.guard.queue.shed",
		metric.WithDescription("Requests the item queue shed (Unavailable with RetryInfo) since start."))
	if err != nil {
		return err
	}
	light, err := m.Int64ObservableCounter("sluice.guard.queue.light",
		metric.WithDescription("Requests of callers under their fair share admitted past waiting requests, within light_reserve_items, since start."))
	if err != nil {
		return err
	}
	slotLimit, err := gauge("sluice.guard.request_slots.limit", "Request slots (max_inflight_requests).")
	if err != nil {
		return err
	}
	slots, err := gauge("sluice.guard.request_slots.in_use", "Request slots taken, of max_inflight_requests.")
	if err != nil {
		return err
	}
	slotWaiting, err := gauge("sluice.guard.request_slots.waiting", "Requests waiting for a request slot.")
	if err != nil {
		return err
	}
	slotShed, err := m.Int64ObservableCounter("sluice.guard.request_slots.shed",
		metric.WithDescription("Requests shed (Unavailable with RetryInfo) for want of a request slot since start."))
	if err != nil {
		return err
	}
	t.stats.setAdmission(state)
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := state()
		o.ObserveInt64(limit, s.ItemLimit)
		o.ObserveInt64(minLimit, s.MinItemLimit)
		o.ObserveInt64(maxLimit, s.MaxItemLimit)
		o.ObserveInt64(inUse, s.ItemsInUse)
		o.ObserveInt64(waiting, int64(s.Waiting))
		o.ObserveInt64(shed, s.Shed)
		o.ObserveInt64(light, s.Light)
		o.ObserveInt64(slotLimit, s.RequestSlots)
		o.ObserveInt64(slots, s.SlotsInUse)
		o.ObserveInt64(slotWaiting, int64(s.SlotsWaiting))
		o.ObserveInt64(slotShed, s.SlotsShed)
		return nil
	}, limit, minLimit, maxLimit, inUse, waiting, shed, light, slotLimit, slots, slotWaiting, slotShed)
	return err
}
