"""Planning a run before launch and billing it after: instance facts, prices, the time and cost
model (`python -m training plan`) and the bill from Slurm's accounting."""
