cp -r /tmp/o/. $OUT/ 2>/dev/null; du -sh $OUT
