"""A run on the cluster from a laptop: submit, watch, fetch and cancel with AWS credentials alone.

`python -m training remote submit|status|fetch|cancel|tunnel` (training/steps/remote.py) reads the
deployment record (stacks/deployment.py) for the region, the bucket and the cluster, submits the chain
of jobs through the Slurm REST API (rest.py) over an SSM port forward, with a token from Secrets Manager
(tokens.py), and reads the run folder from the bucket, where the file system's data repository
association exports everything a job writes (bucket.py).

    target.py   the deployment as the laptop reaches it: REST endpoint, token, bucket, data prefix
    rest.py     the Slurm REST API: the versions the server offers, submit, job states, cancel
    tokens.py   JWTs: signed with PCS's key, or the head node's token (ParallelCluster)
    jobs.py     a chain of jobs (the planner's) as REST job descriptions; the submission record
    bucket.py   the run folder in S3: each step's files, log tails, newest figure; resumable fetch
"""
