"""Planning a run before launch: the time and cost model and its inputs (`python -m training plan`).

The facts it rests on live on the ground floor, where the bill after a run reads them too:
training/costs/instances.py (the instance table), training/costs/prices.py (dated prices) and training/costs/bill.py."""
