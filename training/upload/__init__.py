"""An image set or a screen to the data bucket (`python -m training upload-data`): image_set.py fetches,
checks and uploads an image set, screen_table.py a screen (a LoadData table, its images and masks, the
table rewritten to relative paths); s3.py is the resumable, parallel S3 upload underneath.
"""
