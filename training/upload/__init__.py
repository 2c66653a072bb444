"""An image set to the data bucket (`python -m training upload-data`): image_set.py fetches, checks
and uploads it; s3.py is the resumable, parallel S3 upload underneath.
"""
