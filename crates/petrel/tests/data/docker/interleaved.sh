echo "out 1"
sleep 0.2
echo "err 1" >&2
sleep 0.2
# one 49152-byte stdout line (3 x 16 KiB) written in two pieces, with a
# stderr line in between: the stderr record lands inside the stdout chain
awk 'BEGIN{for(i=0;i<2000;i++) printf "%09d|", i; fflush()}'
sleep 0.3
echo "err 2 (inside the stdout chain)" >&2
sleep 0.3
awk 'BEGIN{for(i=2000;i<4915;i++) printf "%09d|", i; printf "ab\n"}'
sleep 0.2
echo "out 2" 
echo "err 3" >&2
sleep 0.2
printf 'tab\there "q" back\\slash <a&b> caf\303\251 \360\237\230\200 bad\377byte cr\r\n'
printf '\n'
printf 'last line without newline'
