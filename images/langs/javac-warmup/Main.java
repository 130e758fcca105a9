// Compiled once while the langs image is built, so that javac's class-data archive
// holds the compiler classes a typical judged program needs: collections, streams,
// lambdas, generics, records, switch expressions, text blocks, fast I/O.
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.util.*;
import java.util.function.Function;
import java.util.stream.Collectors;
import java.util.stream.IntStream;

public class Main {
    record Edge(int to, long weight) {}

    enum Kind { SMALL, LARGE }

    static final String BANNER = """
        warm-up
        """;

    interface Scorer<T> {
        long score(T item);
    }

    static <T extends Comparable<T>> T largest(List<T> items) {
        return Collections.max(items);
    }

    static long[] dijkstra(List<List<Edge>> graph, int source) {
        long[] dist = new long[graph.size()];
        Arrays.fill(dist, Long.MAX_VALUE);
        dist[source] = 0;
        PriorityQueue<long[]> queue = new PriorityQueue<>(Comparator.comparingLong(a -> a[0]));
        queue.add(new long[] {0, source});
        while (!queue.isEmpty()) {
            long[] top = queue.poll();
            int node = (int) top[1];
            if (top[0] > dist[node]) continue;
            for (Edge edge : graph.get(node)) {
                long next = dist[node] + edge.weight();
                if (next < dist[edge.to()]) {
                    dist[edge.to()] = next;
                    queue.add(new long[] {next, edge.to()});
                }
            }
        }
        return dist;
    }

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        PrintWriter out = new PrintWriter(System.out);
        StringTokenizer tokens = new StringTokenizer("3 1 2");
        int n = tokens.countTokens();
        List<List<Edge>> graph = new ArrayList<>();
        for (int i = 0; i < n; i++) graph.add(new ArrayList<>());
        graph.get(0).add(new Edge(1, Integer.parseInt(tokens.nextToken())));
        graph.get(1).add(new Edge(2, Long.parseLong(tokens.nextToken())));
        Map<Kind, List<Integer>> byKind = IntStream.range(0, 10).boxed()
            .collect(Collectors.groupingBy(x -> x < 5 ? Kind.SMALL : Kind.LARGE));
        Deque<Integer> stack = new ArrayDeque<>(List.of(1, 2, 3));
        TreeMap<String, Integer> counts = new TreeMap<>();
        for (String word : BANNER.strip().split("-")) counts.merge(word, 1, Integer::sum);
        Scorer<String> length = String::length;
        Function<Integer, Integer> square = x -> x * x;
        var kind = Kind.values()[stack.peek() % 2];
        String label = switch (kind) {
            case SMALL -> "small";
            case LARGE -> "large";
        };
        StringBuilder sb = new StringBuilder();
        sb.append(Arrays.toString(dijkstra(graph, 0))).append(' ').append(byKind.size()).append(' ')
            .append(largest(new ArrayList<>(counts.keySet()))).append(' ').append(length.score(label))
            .append(' ').append(square.apply(n)).append(' ').append(Math.floorMod(-7, 3));
        out.println(sb);
        out.flush();
        in.close();
    }
}
