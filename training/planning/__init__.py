"""Planning a run before launch: the time and cost model and its inputs (`python -m training plan`).

The facts it rests on live on the ground floor, where the bill after a run reads them too:
training/instances.py (the instance table), training/prices.py (dated prices) and training/bill.py."""
